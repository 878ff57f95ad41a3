//! Tokenizers: text to token ids and back.
//!
//! A [`Tokenizer`] wraps a [`tokenizers::Tokenizer`] and adds what a server needs beside it: the
//! BOS/EOS ids, whether a BOS is added, and loading from the three places a model's tokenizer
//! lives:
//!
//! - a `tokenizer.json` ([`Tokenizer::from_file`]),
//! - a model directory with `tokenizer.json` + `tokenizer_config.json` (and optionally
//!   `generation_config.json`) ([`Tokenizer::from_model_dir`]),
//! - a GGUF file's metadata ([`Tokenizer::from_gguf_file`], [`Tokenizer::from_gguf_metadata`]),
//!   rebuilt the way transformers' GGUF loader rebuilds it (see `gguf_vocab.rs`),
//! - a tiktoken ranks file with its regex and added tokens ([`Tokenizer::from_tiktoken`], see
//!   `tiktoken.rs`; Qwen3.5/3.6's in `qwen35.rs`).
//!
//! What was built can be written out as a model directory's files (`write.rs`).
//!
//! Special tokens written in the text (`<|im_start|>`) are always matched as single tokens, as
//! transformers does for added tokens. [`IncrementalDetokenizer`] turns a stream of generated ids
//! into text pieces that never split a UTF-8 character.

mod detokenize;
mod gguf_vocab;
mod qwen35;
mod tiktoken;
mod token_bytes;
mod write;

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use radix_templates::gguf::{GgufMetadata, read_gguf_metadata};
use serde_json::Value as Json;

pub use detokenize::IncrementalDetokenizer;
pub use gguf_vocab::{SUPPORTED_GGUF_MODELS, SUPPORTED_GGUF_PRE_TOKENIZERS};
pub use qwen35::{qwen35_tiktoken_options, qwen35_tokenizer_config};
pub use tiktoken::{TiktokenAddedToken, TiktokenOptions};

/// Everything that can go wrong loading a tokenizer or running it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A tokenizer file was read but is not what it should be.
    #[error("{path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The GGUF file's metadata could not be read (not a GGUF file, truncated, corrupt).
    #[error("cannot read GGUF tokenizer metadata: {0}")]
    Gguf(#[from] radix_templates::TemplateError),
    /// A metadata key the tokenizer needs is absent.
    #[error("GGUF metadata has no `{key}`, which {needed_for} needs")]
    MissingKey {
        /// The missing key.
        key: String,
        /// What needs it (the tokenizer kind, or the flag that asks for it).
        needed_for: String,
    },
    /// A metadata key holds something unusable.
    #[error("GGUF metadata `{key}`: {problem}")]
    BadMetadata {
        /// The key.
        key: String,
        /// What is wrong with its value.
        problem: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer kind we cannot build.
    #[error("unsupported GGUF tokenizer.ggml.model {value:?}: supported are {supported}")]
    UnsupportedModel {
        /// The value found.
        value: String,
        /// The supported values, with what they mean.
        supported: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer we do not know.
    #[error("unsupported GGUF tokenizer.ggml.pre {value:?}: supported are {supported}")]
    UnsupportedPreTokenizer {
        /// The value found.
        value: String,
        /// The supported values.
        supported: String,
    },
    /// The `tokenizers` library rejected the tokenizer being built from GGUF metadata.
    #[error("cannot build the tokenizer from GGUF metadata: {0}")]
    Build(String),
    /// Encoding failed.
    #[error("cannot encode a text of {len} bytes: {message}")]
    Encode {
        /// The text's length in bytes.
        len: usize,
        /// The library's message.
        message: String,
    },
    /// A tokenizer file could not be produced.
    #[error("cannot write {path}: {message}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why not.
        message: String,
    },
    /// Decoding failed.
    #[error("cannot decode {count} token ids: {message}")]
    Decode {
        /// How many ids were given.
        count: usize,
        /// The library's message.
        message: String,
    },
}

/// The result of tokenizer operations.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

/// A tokenizer with its special-token facts: BOS, the EOS set, whether BOS is added.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<u32>,
    eos: BTreeSet<u32>,
    /// BOS that [`Tokenizer::encode`] prepends itself, because the post-processor does not.
    prepend_bos: Option<u32>,
    /// EOS that [`Tokenizer::encode`] appends itself.
    append_eos: Option<u32>,
    /// Whether the post-processor adds a BOS itself.
    processor_adds_bos: bool,
    /// The ids of the special added tokens.
    special_ids: BTreeSet<u32>,
    /// The same tokenizer with special tokens encoded as text, made when first needed.
    text_only: Arc<OnceLock<tokenizers::Tokenizer>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos())
            .finish_non_exhaustive()
    }
}

/// What a tokenizer's configuration says about special tokens, before it is checked against the
/// vocabulary.
#[derive(Debug, Default)]
pub(crate) struct SpecialConfig {
    /// The BOS token.
    bos: Option<u32>,
    /// The EOS token proper (the one `add_eos` appends).
    eos: Option<u32>,
    /// Further ids that end generation (end-of-turn, end-of-message).
    more_eos: BTreeSet<u32>,
    /// Whether a BOS is added; `None` leaves it to the post-processor.
    add_bos: Option<bool>,
    /// Whether an EOS is appended.
    add_eos: bool,
}

impl Tokenizer {
    /// Loads a `tokenizer.json`. Its post-processor decides whether a BOS is added (and which);
    /// no EOS is known from this file alone: prefer [`Tokenizer::from_model_dir`] for serving.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let inner = load_tokenizer_json(path)?;
        Self::assemble(inner, SpecialConfig::default(), path)
    }

    /// Loads a model directory: `tokenizer.json`, plus (when present) `tokenizer_config.json` for
    /// `bos_token` and `eos_token`, and `generation_config.json`, whose `eos_token_id` (a number or
    /// a list) joins the EOS set.
    ///
    /// What `encode` adds is what `tokenizer.json`'s post-processor adds, as in transformers 5:
    /// `add_bos_token` in `tokenizer_config.json` is not applied on top (transformers 5.24 does not
    /// either for DeepSeek-V3, whose config asks for a BOS its post-processor does not add).
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let inner = load_tokenizer_json(&dir.join("tokenizer.json"))?;
        let mut special = SpecialConfig::default();

        let config_path = dir.join("tokenizer_config.json");
        if let Some(config) = read_json_if_exists(&config_path)? {
            let token_id = |key: &str| -> Result<Option<u32>> {
                let Some(content) = token_content(&config[key]) else { return Ok(None) };
                inner.token_to_id(content).map(Some).ok_or_else(|| TokenizerError::BadFile {
                    path: config_path.clone(),
                    message: format!("{key} {content:?} is not in the vocabulary"),
                })
            };
            special.bos = token_id("bos_token")?;
            special.eos = token_id("eos_token")?;
        }

        let generation_path = dir.join("generation_config.json");
        if let Some(generation) = read_json_if_exists(&generation_path)? {
            let ids = match &generation["eos_token_id"] {
                Json::Array(items) => items.iter().collect(),
                Json::Null => vec![],
                single => vec![single],
            };
            for id in ids {
                let id = id.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| TokenizerError::BadFile {
                    path: generation_path.clone(),
                    message: format!("eos_token_id holds {id}, not a token id"),
                })?;
                special.more_eos.insert(id);
            }
        }
        Self::assemble(inner, special, dir)
    }

    /// Reads the GGUF file at `path` (metadata only, never the tensors) and builds its tokenizer
    /// with [`Tokenizer::from_gguf_metadata`].
    pub fn from_gguf_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let metadata = read_gguf_metadata(path)?;
        Self::from_gguf_metadata(&metadata)
    }

    /// Builds the tokenizer a GGUF file's metadata describes, as transformers' GGUF loader does.
    ///
    /// Supported: `tokenizer.ggml.model` = `"gpt2"` (byte-level BPE) with a `tokenizer.ggml.pre`
    /// from [`SUPPORTED_GGUF_PRE_TOKENIZERS`] (absent means `"default"`). The vocabulary comes from
    /// `tokenizer.ggml.tokens`, the merges from `tokenizer.ggml.merges`, and tokens marked control
    /// (3) or user-defined (4) in `tokenizer.ggml.token_type` become added tokens (special and
    /// not special). BOS is `tokenizer.ggml.bos_token_id`, added when
    /// `tokenizer.ggml.add_bos_token` is true; the EOS set is `tokenizer.ggml.eos_token_id` plus
    /// `tokenizer.ggml.eot_token_id` and `tokenizer.ggml.eom_token_id` where present.
    pub fn from_gguf_metadata(metadata: &GgufMetadata) -> Result<Self> {
        let (inner, special) = gguf_vocab::build(metadata)?;
        Self::assemble(inner, special, Path::new("<GGUF metadata>"))
    }

    /// Checks the configured special tokens against the vocabulary and the post-processor.
    fn assemble(inner: tokenizers::Tokenizer, special: SpecialConfig, source: &Path) -> Result<Self> {
        let bad = |message: String| TokenizerError::BadFile { path: source.to_owned(), message };
        // What the post-processor adds around an empty text is what `encode` would add.
        let added = inner
            .encode_fast("", true)
            .map_err(|e| bad(format!("the post-processor fails on an empty text: {e}")))?
            .get_ids()
            .to_vec();
        let special_ids: BTreeSet<u32> =
            inner.get_added_tokens_decoder().into_iter().filter(|(_, token)| token.special).map(|(id, _)| id).collect();
        let processor_bos = added.first().copied().filter(|id| special_ids.contains(id));
        let bos = special.bos.or(processor_bos);
        let vocab_size = inner.get_vocab_size(true);
        let mut eos = special.more_eos;
        eos.extend(special.eos);
        for id in bos.iter().chain(&eos) {
            if inner.id_to_token(*id).is_none() {
                return Err(bad(format!("special token id {id} is outside the vocabulary of {vocab_size}")));
            }
        }
        let prepend_bos = match (special.add_bos, processor_bos) {
            (Some(true), None) => {
                Some(bos.ok_or_else(|| bad("add_bos_token is set but there is no BOS token".into()))?)
            }
            _ => None,
        };
        let append_eos = match special.add_eos {
            true => Some(special.eos.ok_or_else(|| bad("add_eos_token is set but there is no EOS token".into()))?),
            false => None,
        };
        Ok(Self {
            inner,
            bos,
            eos,
            prepend_bos,
            append_eos,
            processor_adds_bos: processor_bos.is_some(),
            special_ids,
            text_only: Arc::default(),
        })
    }

    /// Token ids of `text`. Special tokens written in the text are matched as single tokens.
    /// With `add_special_tokens`, the BOS (and EOS) the tokenizer adds are added.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode { len: text.len(), message: e.to_string() })?;
        let mut ids = encoding.get_ids().to_vec();
        if add_special_tokens {
            if let Some(bos) = self.prepend_bos {
                ids.insert(0, bos);
            }
            ids.extend(self.append_eos);
        }
        Ok(ids)
    }

    /// Token ids of a rendered prompt (no BOS or EOS added): like `encode(text, false)`, except
    /// that a special token overlapping one of `as_text` (byte ranges, where the request's own
    /// text spelled it) is encoded as the text it spells, so message text can never open a turn.
    ///
    /// Only those tokens are re-encoded, each on its own: the text around them keeps the
    /// tokens the whole prompt's encoding gave it, so a message re-sent in the next turn
    /// encodes the same way.
    pub fn encode_prompt(&self, text: &str, as_text: &[Range<usize>]) -> Result<Vec<u32>> {
        if as_text.is_empty() {
            return self.encode(text, false);
        }
        Ok(self.encode_prompt_with_offsets(text, as_text)?.0)
    }

    /// The byte offset in `text` where each token of `encode_prompt(text, as_text)` starts.
    pub fn prompt_offsets(&self, text: &str, as_text: &[Range<usize>]) -> Result<Vec<usize>> {
        Ok(self.encode_prompt_with_offsets(text, as_text)?.1)
    }

    /// [`Tokenizer::encode_prompt`] and [`Tokenizer::prompt_offsets`] in one encoding pass: the
    /// ids, and the byte offset in `text` where each starts. For callers that need both (a
    /// hybrid model's snapshot points), which would otherwise encode the prompt twice.
    pub fn encode_prompt_with_offsets(&self, text: &str, as_text: &[Range<usize>]) -> Result<(Vec<u32>, Vec<usize>)> {
        let mut ids = Vec::new();
        let mut offsets = Vec::new();
        self.walk_prompt(text, as_text, |id, offset| {
            ids.push(id);
            offsets.push(offset);
        })?;
        Ok((ids, offsets))
    }

    /// Calls `each(id, start offset)` for the tokens of [`Tokenizer::encode_prompt`].
    fn walk_prompt(&self, text: &str, as_text: &[Range<usize>], mut each: impl FnMut(u32, usize)) -> Result<()> {
        let failed = |e: tokenizers::Error| TokenizerError::Encode { len: text.len(), message: e.to_string() };
        let encoding = self.inner.encode(text, false).map_err(failed)?;
        for (&id, &(start, end)) in encoding.get_ids().iter().zip(encoding.get_offsets()) {
            let spelled_by_request = as_text.iter().any(|r| r.start < end && start < r.end);
            match text.get(start..end) {
                Some(spelling) if spelled_by_request && self.is_special(id) => {
                    let plain = self.text_only().encode(spelling, false).map_err(failed)?;
                    for (&id, &(at, _)) in plain.get_ids().iter().zip(plain.get_offsets()) {
                        each(id, start + at);
                    }
                }
                _ => each(id, start),
            }
        }
        Ok(())
    }

    /// The same tokenizer with special tokens encoded as text.
    fn text_only(&self) -> &tokenizers::Tokenizer {
        self.text_only.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        })
    }

    /// The spellings of the special added tokens (the control tokens a template writes).
    pub fn special_token_texts(&self) -> Vec<String> {
        self.inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|token| token.special)
            .map(|token| token.content)
            .collect()
    }

    /// The text of `ids`; with `skip_special_tokens`, special tokens are left out. Ids outside
    /// the vocabulary are skipped. Byte sequences that are not UTF-8 decode to U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode { count: ids.len(), message: e.to_string() })
    }

    /// The BOS token id, if the tokenizer has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// The ids that end generation: the EOS token plus end-of-turn tokens the configuration names.
    pub fn eos_token_ids(&self) -> &BTreeSet<u32> {
        &self.eos
    }

    /// Whether [`Tokenizer::encode`] with `add_special_tokens` starts the ids with a BOS.
    pub fn add_bos(&self) -> bool {
        self.processor_adds_bos || self.prepend_bos.is_some()
    }

    /// The number of tokens the tokenizer knows, added tokens included (the model's embedding
    /// table may be larger).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token, spelled as the vocabulary spells it (`Ġhello` in byte-level BPE).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary spelling of a token id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special added token (one that `skip_special_tokens` leaves out).
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn load_tokenizer_json(path: &Path) -> Result<tokenizers::Tokenizer> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io { path: path.to_owned(), source })?;
    text.parse::<tokenizers::Tokenizer>()
        .map_err(|e| TokenizerError::BadFile { path: path.to_owned(), message: format!("not a tokenizer.json: {e}") })
}

fn read_json_if_exists(path: &Path) -> Result<Option<Json>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(TokenizerError::Io { path: path.to_owned(), source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::BadFile { path: path.to_owned(), message: format!("not JSON: {e}") })
}

/// The text of a special token in `tokenizer_config.json`: a string or `{"content": ...}`.
fn token_content(value: &Json) -> Option<&str> {
    value.as_str().or_else(|| value["content"].as_str())
}
