//! llama.cpp's llama-server endpoints: `/completion`, `/tokenize`, `/detokenize`, `/apply-template`, `/props`, `/slots`.

use std::sync::Arc;

use axum::Router;

use super::ApiState;

/// The routes of this module (filled in by its owner).
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new()
}
