//! `GET /metrics` (Prometheus text format) and `GET /v1/cache` (the prefix cache report).

use std::sync::Arc;

use axum::Router;

use super::ApiState;

/// The routes of this module (filled in by its owner).
pub(super) fn routes() -> Router<Arc<ApiState>> {
    Router::new()
}
