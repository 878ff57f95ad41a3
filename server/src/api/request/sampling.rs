//! Sampling settings under OpenAI's and llama.cpp's names, read from any generation body.

use serde::Deserialize;

use super::super::ApiError;
use crate::engine::SamplingParams;

/// llama-server's sampling defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05): the
/// server's own, under what the model recommends and the command line sets. OpenAI's (1.0,
/// nothing cut) let a small model's agent loop wander; agents that set nothing (OpenCode with
/// a custom provider) get what they got from llama-server.
pub fn llama_server_sampling() -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, ..SamplingParams::default() }
}

/// The sampling fields of a body; each overrides the endpoint's default.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct SamplingFields {
    /// Softmax temperature; 0 is greedy.
    pub(crate) temperature: Option<f64>,
    /// Nucleus mass kept.
    pub(crate) top_p: Option<f64>,
    /// Candidates kept; 0 or less: all.
    pub(crate) top_k: Option<f64>,
    /// Candidates below this fraction of the best one are dropped.
    pub(crate) min_p: Option<f64>,
    /// Subtracted from every token already generated.
    pub(crate) presence_penalty: Option<f64>,
    /// Subtracted per occurrence of a generated token.
    pub(crate) frequency_penalty: Option<f64>,
    /// vLLM's name.
    pub(crate) repetition_penalty: Option<f64>,
    /// llama.cpp's name, used when `repetition_penalty` is absent.
    pub(crate) repeat_penalty: Option<f64>,
    /// Seed of the random sampler; negative: random.
    pub(crate) seed: Option<i64>,
    /// Never end at a stop token (llama.cpp's and vLLM's name).
    pub(crate) ignore_eos: Option<bool>,
}

impl SamplingFields {
    /// The settings over the endpoint's `defaults`, validated. A negative seed is llama.cpp's
    /// "random" (-1), not a fixed seed.
    pub(crate) fn over(&self, defaults: &SamplingParams) -> Result<SamplingParams, ApiError> {
        let float = |value: Option<f64>, default: f32| value.map_or(default, |v| v as f32);
        let seed = match self.seed {
            None => defaults.seed,
            // llama.cpp prints its "random" seed as 4294967295 (u32 -1) and clients echo it back.
            Some(seed) if seed < 0 || seed == i64::from(u32::MAX) => None,
            Some(seed) => Some(seed as u64),
        };
        let sampling = SamplingParams {
            temperature: float(self.temperature, defaults.temperature),
            top_p: float(self.top_p, defaults.top_p),
            // llama.cpp: 0 or a negative value turns top-k off.
            top_k: self.top_k.map_or(defaults.top_k, |v| v.max(0.0) as usize),
            min_p: float(self.min_p, defaults.min_p),
            presence_penalty: float(self.presence_penalty, defaults.presence_penalty),
            frequency_penalty: float(self.frequency_penalty, defaults.frequency_penalty),
            repetition_penalty: float(self.repetition_penalty.or(self.repeat_penalty), defaults.repetition_penalty),
            seed,
            logprobs: defaults.logprobs,
            ignore_eos: self.ignore_eos.unwrap_or(defaults.ignore_eos),
        };
        sampling.validate().map_err(ApiError::bad_request)?;
        Ok(sampling)
    }
}
