//! The HTTP API (axum): OpenAI chat completions (streaming and not), models, health.

mod anthropic;
mod anthropic_convert;
mod auth;
mod cache_report;
mod chat;
mod completion_params;
mod completions;
mod constrain;
mod error;
mod limits;
mod llama;
mod llama_meta;
mod metrics;
mod output;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use radix_models::tokenizer::Tokenizer;
use radix_templates::parse::OutputFormat;
use radix_templates::prepare::PreparedTemplate;
use serde_json::json;

use crate::engine::EngineHandle;
pub use auth::ApiKeys;
pub use error::ApiError;
pub use limits::{MAX_BODY_BYTES, MAX_JSON_DEPTH};
pub use metrics::HttpMetrics;

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
    /// The model file or directory as loaded (llama.cpp's `/props` `model_path`).
    pub model_path: String,
    /// Most sequences running at once (`--parallel`; llama.cpp's slot count).
    pub total_slots: usize,
    /// Keys every route but `/health` requires (`--api-key`, `--api-key-file`); none: open.
    pub api_keys: ApiKeys,
    /// Most requests waiting for admission before generation routes answer 503 (`--max-queue`).
    pub max_queue: usize,
    /// Requests answered, by route and status (`/metrics`).
    pub http_metrics: HttpMetrics,
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
        // Layers run outermost last-added: count, give Anthropic routes Anthropic's error shape,
        // make errors JSON, check the key, read the body within limits, then refuse generation
        // when the queue is full.
        .layer(from_fn_with_state(Arc::clone(&state), limits::limit_queue))
        .layer(from_fn(limits::read_body))
        .layer(from_fn_with_state(Arc::clone(&state), limits::require_key))
        .layer(from_fn(limits::json_errors))
        .layer(from_fn(anthropic::anthropic_error_shape))
        .layer(from_fn_with_state(Arc::clone(&state), metrics::count_requests))
        .with_state(state)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
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
