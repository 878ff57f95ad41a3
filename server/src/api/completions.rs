//! `POST /v1/completions`: OpenAI text completions (prompt string or token ids, streaming).

use std::sync::Arc;

use axum::Router;

use super::ApiState;

/// The routes of this module (filled in by its owner).
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new()
}
