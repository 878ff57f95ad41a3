//! Writing a tokenizer out as the files a model directory holds.
//!
//! A tokenizer built here (from tiktoken ranks, or GGUF metadata) has no file of its own; a
//! converted model needs one (`tokenizer.json` beside safetensors, or the vocabulary a GGUF writer
//! takes from it). What is written loads back through [`Tokenizer::from_model_dir`] as the same
//! tokenizer, and through transformers as the same ids.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value as Json, json};

use super::{Result, Tokenizer, TokenizerError};

impl Tokenizer {
    /// This tokenizer as a `tokenizer.json` document (the wrapped `tokenizers` tokenizer,
    /// serialized; compact, as the hub's files are).
    pub fn to_tokenizer_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(|e| TokenizerError::Write {
            path: "tokenizer.json".into(),
            message: format!("cannot serialize the tokenizer: {e}"),
        })
    }

    /// Writes [`Tokenizer::to_tokenizer_json`] to `path`.
    pub fn save_tokenizer_json(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let text = self.to_tokenizer_json()?;
        std::fs::write(path, text).map_err(|source| TokenizerError::Io { path: path.to_owned(), source })
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` into `dir` (created if missing). The
    /// config is `config` (model-specific fields such as `tokenizer_class`, see
    /// [`super::qwen35_tokenizer_config`]) plus what the tokenizer itself knows, which `config`
    /// cannot override: `added_tokens_decoder`, `bos_token`, `add_bos_token`, and `eos_token` when
    /// the EOS set has one id. With several, `config` must name `eos_token`, one of them; the others
    /// belong in the model's `generation_config.json`, which is not the tokenizer's to write.
    pub fn write_model_dir(&self, dir: impl AsRef<Path>, mut config: Map<String, Json>) -> Result<()> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let bad = |message: String| TokenizerError::Write { path: config_path.clone(), message };
        let content = |id: u32| self.inner.id_to_token(id).ok_or_else(|| bad(format!("token id {id} has no text")));

        let eos = match (self.eos.len(), config.get("eos_token")) {
            (0, None) => Json::Null,
            (1, None) => Json::String(content(*self.eos.first().expect("one id"))?),
            (_, Some(Json::String(named)))
                if self.inner.token_to_id(named).is_some_and(|id| self.eos.contains(&id)) =>
            {
                Json::String(named.clone())
            }
            (count, named) => {
                return Err(bad(format!(
                    "eos_token {named:?} is not one of the tokenizer's {count} EOS ids; name one of them"
                )));
            }
        };
        let bos = match self.bos {
            Some(id) => Json::String(content(id)?),
            None => Json::Null,
        };
        // Sorted by id, as transformers writes it.
        let added: BTreeMap<u32, Json> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, token)| {
                let entry = json!({
                    "content": token.content,
                    "lstrip": token.lstrip,
                    "normalized": token.normalized,
                    "rstrip": token.rstrip,
                    "single_word": token.single_word,
                    "special": token.special,
                });
                (id, entry)
            })
            .collect();
        let added: Map<String, Json> = added.into_iter().map(|(id, entry)| (id.to_string(), entry)).collect();
        config.insert("added_tokens_decoder".into(), Json::Object(added));
        config.insert("add_bos_token".into(), Json::Bool(self.add_bos()));
        config.insert("bos_token".into(), bos);
        config.insert("eos_token".into(), eos);

        std::fs::create_dir_all(dir).map_err(|source| TokenizerError::Io { path: dir.to_owned(), source })?;
        self.save_tokenizer_json(dir.join("tokenizer.json"))?;
        let text = serde_json::to_string_pretty(&Json::Object(config)).map_err(|e| bad(e.to_string()))?;
        std::fs::write(&config_path, text + "\n")
            .map_err(|source| TokenizerError::Io { path: config_path.clone(), source })
    }
}
