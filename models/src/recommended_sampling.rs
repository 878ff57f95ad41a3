//! The sampling settings a model's authors recommend, as its files carry them: GGUF
//! `general.sampling.*` keys (llama.cpp's converter writes them from `generation_config.json`;
//! Qwen3.5 files have them) or a Hugging Face directory's `generation_config.json`. A server
//! uses them where a request sets nothing itself, as llama-server and vLLM do.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file;
use serde_json::Value as Json;

/// Each setting the model's files recommend; `None` where they say nothing (or something
/// unusable: not a number, not finite).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecommendedSampling {
    /// Softmax temperature.
    pub temperature: Option<f32>,
    /// Candidates kept; 0 (or a negative value in the file) is off.
    pub top_k: Option<usize>,
    /// Nucleus mass kept.
    pub top_p: Option<f32>,
    /// Candidates below this fraction of the best one are dropped.
    pub min_p: Option<f32>,
    /// Multiplicative repetition penalty (1 = off).
    pub repetition_penalty: Option<f32>,
    /// Where the values came from, for the start-up log: the keys that were read.
    pub source: Vec<String>,
}

impl RecommendedSampling {
    /// Whether the files recommend nothing.
    pub fn is_empty(&self) -> bool {
        self.source.is_empty()
    }

    /// From a GGUF header's metadata: llama.cpp's `general.sampling.{temp,top_k,top_p,min_p,
    /// penalty_repeat}`.
    pub fn from_gguf(metadata: &HashMap<String, gguf_file::Value>) -> Self {
        let keys = ["temp", "top_k", "top_p", "min_p", "penalty_repeat"].map(|k| format!("general.sampling.{k}"));
        Self::read(keys, |key| metadata.get(key).and_then(gguf_number), str::to_owned)
    }

    /// From the text of a `generation_config.json` (the fields vLLM reads: `temperature`,
    /// `top_k`, `top_p`, `min_p`, `repetition_penalty`). Text that is not a JSON object
    /// recommends nothing.
    pub fn from_generation_config(text: &str) -> Self {
        let Ok(Json::Object(fields)) = serde_json::from_str::<Json>(text) else {
            return RecommendedSampling::default();
        };
        let keys = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty"].map(str::to_owned);
        Self::read(keys, |key| fields.get(key).and_then(Json::as_f64), |key| format!("generation_config.json {key}"))
    }

    /// The settings whose `keys` (temperature, top-k, top-p, min-p, repetition penalty, in
    /// that order) give a finite `number`; each one read is named in `source` by `name`.
    fn read(keys: [String; 5], number: impl Fn(&str) -> Option<f64>, name: impl Fn(&str) -> String) -> Self {
        let mut source = Vec::new();
        let [temperature, top_k, top_p, min_p, repetition_penalty] = keys.map(|key| {
            let value = number(&key).filter(|v| v.is_finite());
            if value.is_some() {
                source.push(name(&key));
            }
            value
        });
        let float = |v: Option<f64>| v.map(|v| v as f32);
        RecommendedSampling {
            temperature: float(temperature),
            top_k: top_k.map(|v| v.max(0.0) as usize),
            top_p: float(top_p),
            min_p: float(min_p),
            repetition_penalty: float(repetition_penalty),
            source,
        }
    }

    /// From a model directory's `generation_config.json`; none there recommends nothing.
    pub fn from_model_dir(dir: &Path) -> Self {
        std::fs::read_to_string(dir.join("generation_config.json"))
            .map(|text| Self::from_generation_config(&text))
            .unwrap_or_default()
    }
}

/// A numeric GGUF value of any width.
fn gguf_number(value: &gguf_file::Value) -> Option<f64> {
    use gguf_file::Value as V;
    Some(match *value {
        V::U8(v) => v.into(),
        V::I8(v) => v.into(),
        V::U16(v) => v.into(),
        V::I16(v) => v.into(),
        V::U32(v) => v.into(),
        V::I32(v) => v.into(),
        V::U64(v) => v as f64,
        V::I64(v) => v as f64,
        V::F32(v) => v.into(),
        V::F64(v) => v,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf_file::Value as V;

    #[test]
    fn gguf_keys_of_any_numeric_type_are_read_and_named() {
        let metadata: HashMap<String, V> = [
            ("general.sampling.temp", V::F32(0.6)),
            ("general.sampling.top_k", V::I32(20)),
            ("general.sampling.top_p", V::F64(0.95)),
            ("general.sampling.penalty_repeat", V::String("1.1".into())),
            ("general.architecture", V::String("qwen35".into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let s = RecommendedSampling::from_gguf(&metadata);
        assert_eq!(s.temperature, Some(0.6));
        assert_eq!(s.top_k, Some(20));
        assert_eq!(s.top_p, Some(0.95));
        assert_eq!(s.min_p, None);
        assert_eq!(s.repetition_penalty, None, "a string is not a number");
        assert_eq!(s.source, ["general.sampling.temp", "general.sampling.top_k", "general.sampling.top_p"]);
    }

    #[test]
    fn a_negative_top_k_is_off_and_non_finite_values_are_ignored() {
        let metadata: HashMap<String, V> =
            [("general.sampling.top_k", V::I32(-1)), ("general.sampling.temp", V::F32(f32::NAN))]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
        let s = RecommendedSampling::from_gguf(&metadata);
        assert_eq!((s.top_k, s.temperature), (Some(0), None));
        assert!(RecommendedSampling::from_gguf(&HashMap::new()).is_empty());
    }

    #[test]
    fn generation_config_fields_are_read() {
        let text = r#"{"bos_token_id": 1, "do_sample": true, "temperature": 0.7, "top_k": 20,
            "top_p": 0.8, "repetition_penalty": 1.05, "transformers_version": "4.44.0"}"#;
        let s = RecommendedSampling::from_generation_config(text);
        assert_eq!(
            (s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty),
            (Some(0.7), Some(20), Some(0.8), None, Some(1.05))
        );
        assert_eq!(s.source.len(), 4);
        assert!(RecommendedSampling::from_generation_config("not json").is_empty());
        assert!(RecommendedSampling::from_generation_config("[1, 2]").is_empty());
    }
}
