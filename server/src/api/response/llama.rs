//! llama.cpp's server responses: `/completion` (whole and streamed), `generation_settings` and the slot objects
//! of `/props` and `/slots`, and the small answers of `/tokenize`, `/detokenize` and
//! `/apply-template`. Field names and JSON types are llama-server's.

use serde::Serialize;

use super::openai::TokenLogprob;
use crate::engine::SamplingParams;

/// llama-server's seed when the request gave none (`LLAMA_DEFAULT_SEED`): "a random one".
const RANDOM_SEED: u64 = u32::MAX as u64;

/// The `generation_settings` object (and `/props`' and `/slots`' `params`): the settings a
/// request ran with, under llama-server's names. Samplers we do not have are reported off.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GenerationSettings {
    n_ctx: usize,
    model: String,
    n_predict: i64,
    max_tokens: i64,
    seed: u64,
    temperature: f32,
    dynatemp_range: f64,
    dynatemp_exponent: f64,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    xtc_probability: f64,
    xtc_threshold: f64,
    typical_p: f64,
    repeat_last_n: i64,
    repeat_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    dry_multiplier: f64,
    mirostat: u32,
    stop: Vec<String>,
    n_keep: u32,
    n_discard: u32,
    ignore_eos: bool,
    stream: bool,
    n_probs: u32,
    min_keep: u32,
    grammar: &'static str,
    samplers: [&'static str; 5],
    timings_per_token: bool,
}

impl GenerationSettings {
    /// The settings of a request on a model of `n_ctx` tokens served as `model`.
    pub(crate) fn new(
        n_ctx: usize,
        model: &str,
        sampling: &SamplingParams,
        n_predict: i64,
        stops: &[String],
        stream: bool,
    ) -> Self {
        GenerationSettings {
            n_ctx,
            model: model.to_owned(),
            n_predict,
            max_tokens: n_predict,
            seed: sampling.seed.unwrap_or(RANDOM_SEED),
            temperature: sampling.temperature,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            top_k: sampling.top_k,
            top_p: sampling.top_p,
            min_p: sampling.min_p,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            typical_p: 1.0,
            repeat_last_n: -1,
            repeat_penalty: sampling.repetition_penalty,
            presence_penalty: sampling.presence_penalty,
            frequency_penalty: sampling.frequency_penalty,
            dry_multiplier: 0.0,
            mirostat: 0,
            stop: stops.to_vec(),
            n_keep: 0,
            n_discard: 0,
            ignore_eos: sampling.ignore_eos,
            stream,
            n_probs: 0,
            min_keep: 0,
            grammar: "",
            samplers: ["penalties", "top_k", "top_p", "min_p", "temperature"],
            timings_per_token: false,
        }
    }
}

/// A `/completion` chunk while tokens stream (`stop: false`).
#[derive(Debug, Serialize)]
pub(crate) struct CompletionChunk {
    /// Always 0: one prompt per request.
    pub index: u32,
    /// The text this token completed (may be empty).
    pub content: String,
    /// The token, where one was sampled.
    pub tokens: Vec<u32>,
    /// Always false here.
    pub stop: bool,
    /// -1: llama-server's "any slot" (we have no fixed slots).
    pub id_slot: i32,
    /// Tokens generated so far.
    pub tokens_predicted: usize,
    /// Prompt tokens.
    pub tokens_evaluated: usize,
    /// The token's probabilities, when `n_probs` asked for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_probabilities: Option<Vec<TokenLogprob>>,
}

/// The final `/completion` object: the whole response, or the last streamed chunk.
#[derive(Debug, Serialize)]
pub(crate) struct CompletionFinal {
    /// Always 0.
    pub index: u32,
    /// The text (empty on the last streamed chunk).
    pub content: String,
    /// The generated tokens, with `return_tokens`.
    pub tokens: Vec<u32>,
    /// -1: any slot.
    pub id_slot: i32,
    /// Always true here.
    pub stop: bool,
    /// The model's name.
    pub model: String,
    /// Tokens generated.
    pub tokens_predicted: usize,
    /// Prompt tokens.
    pub tokens_evaluated: usize,
    /// What the request ran with.
    pub generation_settings: GenerationSettings,
    /// The prompt, as text.
    pub prompt: String,
    /// `content` holds a newline.
    pub has_new_line: bool,
    /// The context filled up.
    pub truncated: bool,
    /// `eos`, `limit` or `word`.
    pub stop_type: &'static str,
    /// The stop string that ended it, else empty.
    pub stopping_word: String,
    /// Prompt tokens that came from the cache.
    pub tokens_cached: usize,
    /// How long it took.
    pub timings: super::Timings,
    /// Every token's probabilities, when `n_probs` asked for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_probabilities: Option<Vec<TokenLogprob>>,
}

/// A slot's `next_token` when idle.
#[derive(Debug, Serialize)]
struct NextToken {
    has_next_token: bool,
    has_new_line: bool,
    n_remain: i64,
    n_decoded: u32,
    stopping_word: &'static str,
}

/// A slot as `/props` (`default_generation_settings`) and `/slots` show it.
#[derive(Debug, Serialize)]
pub(crate) struct Slot {
    id: usize,
    id_task: i64,
    n_ctx: usize,
    speculative: bool,
    is_processing: bool,
    params: GenerationSettings,
    prompt: &'static str,
    next_token: NextToken,
}

impl Slot {
    /// Slot `id`, idle but for `is_processing`, with the default settings `params`.
    pub(crate) fn idle(id: usize, n_ctx: usize, is_processing: bool, params: GenerationSettings) -> Self {
        Slot {
            id,
            id_task: -1,
            n_ctx,
            speculative: false,
            is_processing,
            params,
            prompt: "",
            next_token: NextToken {
                has_next_token: is_processing,
                has_new_line: false,
                n_remain: -1,
                n_decoded: 0,
                stopping_word: "",
            },
        }
    }
}

/// `/props`' `modalities`: text only.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Modalities {
    vision: bool,
    audio: bool,
    video: bool,
}

/// `GET /props`.
#[derive(Debug, Serialize)]
pub(crate) struct Props {
    /// Slot 0, idle.
    pub default_generation_settings: Slot,
    /// `--parallel`.
    pub total_slots: usize,
    /// The model's name.
    pub model_alias: String,
    /// The model file or directory.
    pub model_path: String,
    /// Text only.
    pub modalities: Modalities,
    /// `/slots` is served.
    pub endpoint_slots: bool,
    /// `POST /props` is not.
    pub endpoint_props: bool,
    /// `/metrics` is served.
    pub endpoint_metrics: bool,
    /// The default chat template's text.
    pub chat_template: String,
    /// Left empty (an object, as llama-server's).
    pub chat_template_caps: Empty,
    /// The BOS token's text.
    pub bos_token: String,
    /// The EOS token's text.
    pub eos_token: String,
    /// `radix-serve <version>`.
    pub build_info: String,
    /// Never asleep.
    pub is_sleeping: bool,
    /// The `tool_use` template, where the model has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template_tool_use: Option<String>,
    /// How K and V are stored and how many tokens the pool holds (ours; llama-server has no
    /// such field).
    pub kv_cache: crate::api::KvCacheInfo,
}

/// `{}`.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Empty {}

/// `/tokenize`'s answer: ids, or `{id, piece}` objects with `with_pieces`.
#[derive(Debug, Serialize)]
pub(crate) struct Tokenized<T> {
    /// The tokens.
    pub tokens: Vec<T>,
}

/// A token with its text (`with_pieces`).
#[derive(Debug, Serialize)]
pub(crate) struct TokenPiece {
    /// The id.
    pub id: u32,
    /// Its text, or its bytes where it is part of a multi-byte character.
    pub piece: Piece,
}

/// A token's text, or its bytes where they are not whole UTF-8 (llama-server gives the bytes).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Piece {
    /// Whole characters.
    Text(String),
    /// Part of a character.
    Bytes(Vec<u8>),
}

/// `/detokenize`'s answer.
#[derive(Debug, Serialize)]
pub(crate) struct Detokenized {
    /// The text.
    pub content: String,
}

/// `/apply-template`'s answer.
#[derive(Debug, Serialize)]
pub(crate) struct AppliedTemplate {
    /// The rendered prompt.
    pub prompt: String,
    /// Its length in tokens.
    pub prompt_tokens: usize,
    /// Where its tokens go (`prompt_parts.rs`).
    pub prompt_parts: super::radix::PromptParts,
}

/// `GET /health`: `ok`, or `engine stopped` (with 503), and the engine's counts.
#[derive(Debug, Serialize)]
pub(crate) struct Health {
    /// `ok` or `engine stopped`.
    pub status: &'static str,
    /// The engine's counts.
    pub engine: crate::engine::EngineStats,
}
