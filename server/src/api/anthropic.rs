//! The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

use std::sync::Arc;

use axum::Router;

use super::ApiState;

/// The routes of this module (filled in by its owner).
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new()
}
