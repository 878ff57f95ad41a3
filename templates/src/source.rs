//! Where a chat template comes from: `tokenizer_config.json`, a `.jinja` file, a model directory,
//! or GGUF metadata, together with the special tokens the template may print.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::TemplateError;
use crate::gguf::{GgufValue, read_gguf_metadata};

/// The special-token attributes transformers passes to every template render
/// (`PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES`).
pub const SPECIAL_TOKEN_ATTRIBUTES: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// The template text(s) of a model and the special tokens they may reference.
#[derive(Debug, Clone)]
pub struct TemplateSource {
    /// Named templates; a single template is stored as `default`.
    pub templates: BTreeMap<String, String>,
    /// `bos_token`, `eos_token`, ... as strings, passed to the template as variables.
    pub special_tokens: BTreeMap<String, String>,
    /// The file the template was read from, for messages.
    pub origin: PathBuf,
}

impl TemplateSource {
    /// Loads a template from a path, choosing the reader by what the path is: a `.gguf` file,
    /// a `.json` tokenizer config, a model directory, or any other file read as Jinja source.
    pub fn from_path(path: &Path) -> Result<Self, TemplateError> {
        if path.is_dir() {
            return Self::from_model_dir(path);
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("gguf") => Self::from_gguf(path),
            Some("json") => Self::from_tokenizer_config(path),
            _ => Self::from_jinja_file(path),
        }
    }

    /// A plain Jinja file; it comes with no special tokens.
    pub fn from_jinja_file(path: &Path) -> Result<Self, TemplateError> {
        let text = std::fs::read_to_string(path).map_err(|e| TemplateError::io(path, e))?;
        Ok(Self::single(text, BTreeMap::new(), path))
    }

    /// A model directory: `chat_template.jinja` if present (as transformers 5 saves it),
    /// else the `chat_template` of `tokenizer_config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<Self, TemplateError> {
        let config_path = dir.join("tokenizer_config.json");
        let jinja_path = dir.join("chat_template.jinja");
        if jinja_path.is_file() {
            let text = std::fs::read_to_string(&jinja_path).map_err(|e| TemplateError::io(&jinja_path, e))?;
            let special_tokens = if config_path.is_file() {
                special_tokens_from_config(&read_json(&config_path)?)
            } else {
                BTreeMap::new()
            };
            return Ok(Self::single(text, special_tokens, &jinja_path));
        }
        Self::from_tokenizer_config(&config_path)
    }

    /// The `chat_template` of a `tokenizer_config.json`: a string, or a list of
    /// `{"name", "template"}` entries.
    pub fn from_tokenizer_config(path: &Path) -> Result<Self, TemplateError> {
        let config = read_json(path)?;
        let mut templates = BTreeMap::new();
        match config.get("chat_template") {
            Some(Json::String(text)) => {
                templates.insert("default".to_owned(), text.clone());
            }
            Some(Json::Array(entries)) => {
                for entry in entries {
                    let (Some(name), Some(text)) =
                        (entry.get("name").and_then(Json::as_str), entry.get("template").and_then(Json::as_str))
                    else {
                        return Err(TemplateError::BadSource {
                            path: path.to_owned(),
                            message: "a chat_template list entry lacks a string `name` or `template`".into(),
                        });
                    };
                    templates.insert(name.to_owned(), text.to_owned());
                }
            }
            _ => return Err(TemplateError::NoTemplate { path: path.to_owned() }),
        }
        Ok(TemplateSource { templates, special_tokens: special_tokens_from_config(&config), origin: path.to_owned() })
    }

    /// `tokenizer.chat_template` from GGUF metadata, with BOS and EOS from the token list.
    pub fn from_gguf(path: &Path) -> Result<Self, TemplateError> {
        let metadata = read_gguf_metadata(path)?;
        let Some(GgufValue::String(text)) = metadata.get("tokenizer.chat_template") else {
            return Err(TemplateError::NoTemplate { path: path.to_owned() });
        };
        Ok(Self::single(text.clone(), gguf_special_tokens(&metadata), path))
    }

    /// The special tokens a model's own files name (BOS and EOS of a GGUF file, the
    /// `tokenizer_config.json` of a directory), for a template given separately to a model
    /// whose files carry none.
    pub fn special_tokens_of(model: &Path) -> Result<BTreeMap<String, String>, TemplateError> {
        if model.is_dir() {
            let config_path = model.join("tokenizer_config.json");
            return match config_path.is_file() {
                true => Ok(special_tokens_from_config(&read_json(&config_path)?)),
                false => Ok(BTreeMap::new()),
            };
        }
        Ok(gguf_special_tokens(&read_gguf_metadata(model)?))
    }

    fn single(text: String, special_tokens: BTreeMap<String, String>, origin: &Path) -> Self {
        TemplateSource {
            templates: BTreeMap::from([("default".to_owned(), text)]),
            special_tokens,
            origin: origin.to_owned(),
        }
    }

    /// The template transformers would pick: `tool_use` when tools are given and one exists,
    /// else `default`.
    pub fn select(&self, has_tools: bool) -> Result<(&str, &str), TemplateError> {
        if self.templates.len() == 1 {
            let (name, text) = self.templates.iter().next().expect("one template");
            return Ok((name, text));
        }
        let name = if has_tools && self.templates.contains_key("tool_use") { "tool_use" } else { "default" };
        self.templates.get_key_value(name).map(|(n, t)| (n.as_str(), t.as_str())).ok_or_else(|| {
            TemplateError::BadSource {
                path: self.origin.clone(),
                message: "this model has several chat templates and none is named `default`".into(),
            }
        })
    }
}

fn read_json(path: &Path) -> Result<Json, TemplateError> {
    let text = std::fs::read_to_string(path).map_err(|e| TemplateError::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| TemplateError::BadSource { path: path.to_owned(), message: format!("invalid JSON: {e}") })
}

/// Special tokens as transformers' `special_tokens_map`: each attribute that is set, as a string,
/// plus the named `extra_special_tokens` (Gemma 3's `boi_token`, ...), which transformers 5 also
/// exposes as attributes. A token may be a string or an `AddedToken` object with `content`.
fn special_tokens_from_config(config: &Json) -> BTreeMap<String, String> {
    let token_text = |value: &Json| match value {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    };
    let mut tokens: BTreeMap<String, String> = SPECIAL_TOKEN_ATTRIBUTES
        .iter()
        .filter_map(|attribute| Some(((*attribute).to_owned(), token_text(config.get(*attribute)?)?)))
        .collect();
    if let Some(Json::Object(extra)) = config.get("extra_special_tokens") {
        for (name, value) in extra {
            if let Some(text) = token_text(value) {
                tokens.entry(name.clone()).or_insert(text);
            }
        }
    }
    tokens
}

/// BOS and EOS of a GGUF file's token list, as transformers' `special_tokens_map` names them.
fn gguf_special_tokens(metadata: &crate::gguf::GgufMetadata) -> BTreeMap<String, String> {
    let mut special_tokens = BTreeMap::new();
    if let Some(GgufValue::StringArray(tokens)) = metadata.get("tokenizer.ggml.tokens") {
        for (attribute, key) in
            [("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id")]
        {
            if let Some(GgufValue::Int(id)) = metadata.get(key)
                && let Some(token) = usize::try_from(*id).ok().and_then(|i| tokens.get(i))
            {
                special_tokens.insert(attribute.to_owned(), token.clone());
            }
        }
    }
    special_tokens
}
