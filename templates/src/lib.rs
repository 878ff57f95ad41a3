//! Chat templates for radix-serve.
//!
//! - [`render`]: render a model's chat template byte-identically to transformers'
//!   `apply_chat_template`.
//! - [`prepare`]: prepare an agent's messages so every template accepts them and a stable
//!   system block stays a prompt prefix (so the radix cache hits).
//! - [`parse`]: turn generated text into content, reasoning and tool calls, also while streaming.
//! - [`format`](mod@format): a model family's output conventions (reasoning markers, tool-call framing,
//!   end-of-turn tokens), decided once from its template.
//! - [`request`]: the OpenAI chat-completions fields that decide what a template renders.

pub mod format;
pub mod gguf;
pub mod parse;
pub mod prepare;
mod pyvalue;
pub mod render;
pub mod request;
pub mod source;
pub mod testing;

use std::path::{Path, PathBuf};

pub use format::ModelFormat;
pub use render::{ChatTemplate, RenderInput};
pub use request::ChatRequest;
pub use source::TemplateSource;

/// Everything that can go wrong loading or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// A template file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file was read but is not what it should be.
    #[error("{path}: {message}")]
    BadSource {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A tokenizer config or GGUF file holds no chat template.
    #[error("{path} has no chat template; pass one with --chat-template-file")]
    NoTemplate {
        /// The file searched.
        path: PathBuf,
    },
    /// The template does not compile.
    #[error("chat template syntax error: {message}")]
    Syntax {
        /// minijinja's description, with the line.
        message: String,
    },
    /// The template itself rejected the conversation with `raise_exception(message)`.
    #[error("{0}")]
    Raised(String),
    /// Rendering failed for another reason (a type error, a missing method, ...).
    #[error("chat template error: {message}")]
    Render {
        /// minijinja's description.
        message: String,
    },
    /// The request cannot be rendered (empty conversation, conflicting options, bad shapes).
    #[error("{0}")]
    BadRequest(String),
}

impl TemplateError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        TemplateError::Io { path: path.to_owned(), source }
    }
}
