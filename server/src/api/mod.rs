//! The HTTP API (axum): OpenAI chat and text completions, llama.cpp's server endpoints, the
//! Anthropic Messages API, models, health and metrics. Each API reads its body into typed
//! structs (request/), maps it to one generation spec, and answers through the one driver
//! (driver.rs) in its own wire format. router_compat.rs answers what cache-aware routers ask of
//! a worker (server and model info, load, cache flush) and checks routing keys.

mod anthropic;
mod anthropic_convert;
mod auth;
mod browser;
mod cache_report;
mod chat;
mod completions;
mod constrain;
mod driver;
mod error;
mod limits;
mod llama;
mod llama_meta;
mod logprobs;
mod metrics;
mod output;
mod preparation;
mod prompt_parts;
mod prompt_structure;
mod recent;
mod recorder;
mod reply;
mod request;
mod response;
mod router_compat;
mod snapshot_points;
mod ui;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use radix_models::tokenizer::Tokenizer;
use radix_templates::ModelFormat;
use radix_templates::prepare::{ControlSpellings, PreparedTemplate};

use crate::engine::{EngineHandle, SamplingParams};
pub use auth::ApiKeys;
pub use browser::BrowserPolicy;
pub use error::ApiError;
pub use metrics::HttpMetrics;
pub use preparation::PreparationPool;
pub use recent::RecentRequests;
pub use recorder::RequestRecorder;
pub use request::llama_server_sampling;

/// Largest request body accepted (agent prompts with long files stay far below it).
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// Deepest JSON nesting accepted; no API shape needs more than a handful of levels, and a
/// recursive parser must not be handed unbounded depth.
pub const MAX_JSON_DEPTH: usize = 128;

/// The KV cache's element types and size in tokens, as `/props` reports them.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct KvCacheInfo {
    /// K's type (`--cache-type-k`).
    #[serde(serialize_with = "kv_type_name")]
    pub type_k: radix_models::KvDType,
    /// V's type (`--cache-type-v`).
    #[serde(serialize_with = "kv_type_name")]
    pub type_v: radix_models::KvDType,
    /// Tokens the pool holds, every sequence and cached prefix together.
    pub capacity_tokens: usize,
}

fn kv_type_name<S: serde::Serializer>(t: &radix_models::KvDType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(t.name())
}

/// What every handler shares.
pub struct ApiState {
    /// The engine thread.
    pub engine: EngineHandle,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template with its probed behaviour.
    pub template: PreparedTemplate,
    /// How the model writes reasoning and tool calls.
    pub format: ModelFormat,
    /// Tokens that end a reply (EOS and the format's end-of-turn tokens).
    pub stop_tokens: Vec<u32>,
    /// The name clients use for the model.
    pub model_name: String,
    /// Sampling settings for the fields a request leaves out, on every generation route:
    /// llama-server's defaults, under the model's recommended ones, under the command line's.
    pub sampling_defaults: SamplingParams,
    /// Longest context of one sequence.
    pub context_length: usize,
    /// The architecture's name as GGUF metadata spells it (`llama`, `qwen2`, ...; `/model_info`).
    pub model_type: String,
    /// Prompts reuse cached prefixes (false with `--no-prefix-cache`; `/server_info`).
    pub prefix_cache: bool,
    /// The model file or directory as loaded (llama.cpp's `/props` `model_path`).
    pub model_path: String,
    /// Most sequences running at once (`--parallel`; llama.cpp's slot count).
    pub total_slots: usize,
    /// How the KV cache stores K and V, and how many tokens it holds (`/props`).
    pub kv_cache: KvCacheInfo,
    /// Keys every route but `/health` requires (`--api-key`, `--api-key-file`); none: open.
    pub api_keys: ApiKeys,
    /// Keys that also see prompt text in `/v1/cache` (`--admin-api-key`); none: nobody does.
    pub admin_keys: ApiKeys,
    /// Log lines may quote prompts (`--log-prompts`).
    pub log_prompts: bool,
    /// The tokenizer's control-token spellings, which message text may write only as text;
    /// `None` with `--content-control-tokens` (or a tokenizer without special tokens).
    pub content_controls: Option<ControlSpellings>,
    /// The served model has recurrent layers (Qwen3.5's Gated DeltaNet): a cached prefix is
    /// reusable only up to a saved recurrent state, so chat requests carry snapshot points.
    pub hybrid: bool,
    /// The tokenizer's control-token spellings whatever `--content-control-tokens` says: where
    /// message headers are, for snapshot points. `None` for a tokenizer without special tokens.
    pub control_spellings: Option<ControlSpellings>,
    /// Keep Claude Code's billing block in Anthropic requests' system prompt
    /// (`--keep-billing-header`); by default it is left out, so the system prompt stays a prefix.
    pub keep_billing_header: bool,
    /// Which `Host` names and CORS origins are served (`--allowed-hosts`, `--cors-origin`).
    pub browser: BrowserPolicy,
    /// Most requests waiting for admission before generation routes answer 503 (`--max-queue`).
    pub max_queue: usize,
    /// Where requests are prepared, off the async workers.
    pub preparation: PreparationPool,
    /// Requests answered, by route and status (`/metrics`).
    pub http_metrics: HttpMetrics,
    /// Where chat request bodies are recorded (`--record-requests`); `None`: nowhere.
    pub recorder: Option<RequestRecorder>,
    /// The last requests, for the cache page (`/`, `GET /v1/cache/requests`).
    pub recent: Arc<RecentRequests>,
}

/// The router with every route, in groups that carry their own guards: `/health` open for
/// probes and the cache page (`/`, `/ui`) open for browsers (but for the `Host` check); every other route behind the `Host` check, the API key,
/// the JSON content type and the body limits; the routes that queue work on the engine also
/// behind the queue limit; the Anthropic routes answering errors in Anthropic's shape; CORS
/// around everything, since preflights carry no key. Layers run outermost last-added.
pub fn router(state: Arc<ApiState>) -> Router {
    let queue_limit = || from_fn_with_state(Arc::clone(&state), limits::limit_queue);
    let host_check = || from_fn_with_state(Arc::clone(&state), browser::check_host);
    let guarded = |routes: Router<Arc<ApiState>>| {
        routes
            .layer(from_fn(recent::session_scope))
            .layer(from_fn(router_compat::session_affinity))
            .layer(from_fn(limits::read_body))
            .layer(from_fn(browser::require_json))
            .layer(from_fn_with_state(Arc::clone(&state), limits::require_key))
            .layer(host_check())
    };
    let generation = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .merge(completions::routes())
        .merge(llama::generation_routes())
        .route_layer(queue_limit());
    let openai = Router::new()
        .route("/v1/models", get(models))
        .merge(generation)
        .merge(llama::routes())
        .merge(metrics::routes())
        .merge(router_compat::routes())
        .merge(ui::data_routes())
        // Here, so that an unknown route also asks for the key (and the metrics name it "other").
        .fallback(|| async { ApiError::NotFound });
    let anthropic = anthropic::generation_routes().route_layer(queue_limit()).merge(anthropic::routes());
    // Errors made by the guards or by axum become JSON, then take Anthropic's shape.
    let anthropic = guarded(anthropic).layer(from_fn(limits::json_errors)).layer(from_fn(anthropic::error_shape));
    Router::new()
        .route("/health", get(health))
        .merge(ui::page_routes())
        .route_layer(host_check())
        .merge(guarded(openai))
        .merge(anthropic)
        .layer(from_fn(limits::json_errors))
        .layer(from_fn_with_state(Arc::clone(&state), metrics::count_requests))
        .layer(from_fn_with_state(Arc::clone(&state), browser::cors))
        .with_state(state)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
}

async fn models(State(state): State<Arc<ApiState>>) -> axum::Json<serde_json::Value> {
    axum::Json(response::to_json(&response::openai::ModelList::new(&state.model_name, state.context_length)))
}

async fn health(State(state): State<Arc<ApiState>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let stats = state.engine.stats();
    if !state.engine.alive() {
        let body = response::llama::Health { status: "engine stopped", engine: stats };
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, axum::Json(response::to_json(&body))).into_response();
    }
    axum::Json(response::to_json(&response::llama::Health { status: "ok", engine: stats })).into_response()
}
