//! The HTTP API (axum): OpenAI chat completions (streaming and not), models, health.

mod anthropic;
mod chat;
mod completions;
mod error;
mod llama;
mod metrics;
mod output;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use radix_models::tokenizer::Tokenizer;
use radix_templates::parse::OutputFormat;
use radix_templates::prepare::PreparedTemplate;
use serde_json::json;

use crate::engine::EngineHandle;
pub use error::ApiError;

/// What every handler shares.
pub struct ApiState {
    /// The engine thread.
    pub engine: EngineHandle,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template with its probed behaviour.
    pub template: PreparedTemplate,
    /// How the model writes reasoning and tool calls.
    pub output_format: OutputFormat,
    /// Tokens that end a reply (EOS, end of turn).
    pub stop_tokens: Vec<u32>,
    /// The name clients use for the model.
    pub model_name: String,
    /// Longest context of one sequence.
    pub context_length: usize,
}

/// The router with every route.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .merge(completions::routes())
        .merge(llama::routes())
        .merge(anthropic::routes())
        .merge(metrics::routes())
        .with_state(state)
        .layer(axum::extract::DefaultBodyLimit::max(32 << 20))
}

async fn models(State(state): State<Arc<ApiState>>) -> axum::Json<serde_json::Value> {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "radix-serve",
            "context_length": state.context_length,
            "meta": {"n_ctx_train": state.context_length}
        }]
    }))
}

async fn health(State(state): State<Arc<ApiState>>) -> axum::Json<serde_json::Value> {
    let stats = state.engine.stats();
    axum::Json(json!({"status": "ok", "engine": stats}))
}
