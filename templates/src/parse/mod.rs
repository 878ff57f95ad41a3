//! Parsing of generated model text into OpenAI message parts: content, reasoning and tool
//! calls, for a whole reply ([`crate::testing::parse_complete`]) and incrementally while streaming
//! ([`StreamingParser`]).
//!
//! # Guarantees
//!
//! * **Chunking independence.** For every way of splitting a reply into `push` calls,
//!   `ParsedMessage::from_events(events of all pushes ++ finish())` is the same message, and
//!   [`crate::testing::parse_complete`] is defined as exactly that. The parser only decides something once
//!   the text seen so far determines it; everything else is held back.
//! * **No partial markers.** A suffix that could still become a marker (`<think>`,
//!   `</think>`, `<tool_call>`, `</tool_call>` for [`OutputFormat::Hermes`] and
//!   [`OutputFormat::QwenXml`],
//!   `<|python_tag|>` for [`OutputFormat::Llama3Json`]) is held back until it is
//!   disambiguated (or flushed by [`StreamingParser::finish`]). A marker that ends up as
//!   text (see below) always starts its own `Content`/`Reasoning` event and is never split
//!   across events.
//! * **Prompt streaming.** Ordinary text is emitted as soon as it arrives; only a possible
//!   marker suffix, newlines at the end of reasoning, and whitespace at the start of a
//!   segment (the reply's start, after `</think>`, after a tool call) are held back.
//! * **Nothing is lost.** Every character of the reply ends up in content, reasoning, a
//!   call's name or arguments, or is structure (a recognised marker, the JSON framing of an
//!   accepted call, the tags and framing newlines of a Qwen XML call, a `;` between Llama 3
//!   calls, trimmed whitespace).
//! * Never panics, whatever the text.
//!
//! # Hermes / Qwen rules ([`OutputFormat::Hermes`])
//!
//! * **Reasoning.** `<think>` opens reasoning only at the very start of the reply (after
//!   optional whitespace, which is dropped), or the reply starts in reasoning when
//!   [`ParserOptions::starts_in_reasoning`] is set (the generation prompt already opened
//!   `<think>`; a repeated `<think>` right at the start is then dropped). Reasoning runs until
//!   the first `</think>` (or the end of the reply). Like Qwen's template, newlines at both
//!   ends of the reasoning are stripped, and newlines right after `</think>` are stripped
//!   from the content. There is at most one reasoning block.
//! * **`</think>` without `<think>`.** Reclassifying text already streamed as content is
//!   impossible, so the rule is: without `starts_in_reasoning` and without a leading
//!   `<think>`, the whole reply is content and a later `</think>` (or `<think>`) is literal
//!   text. Servers must set `starts_in_reasoning` when the rendered generation prompt ends in
//!   an open `<think>` — that is the case where Qwen3/QwQ "omit" the opening tag.
//! * **Tool calls** (only with [`ParserOptions::tools_enabled`]): `<tool_call>` followed by a
//!   JSON object with a string `"name"` and an `"arguments"` (or `"parameters"`) value of any
//!   JSON type, then `</tool_call>`. Other keys are skipped; keys may come in any order.
//!   Content before a call is content (kept byte-exact, trailing newline included), but
//!   whitespace at the start of a segment (reply start, after `</think>`, between calls) is
//!   dropped when a call follows, and whitespace after the last call is dropped at the end of
//!   the reply. Text after a call is content.
//! * **Commitment.** A call is *committed* — `ToolCallStart` is emitted, with id
//!   `format!("{tool_call_id_prefix}{index}")` — the moment its name string closes. From
//!   then on the call stands whatever follows: argument text is streamed as
//!   `ToolCallArguments` deltas as it arrives (raw bytes of the model's output; a string
//!   value keeps its quotes and escapes), and if the JSON later breaks (a `<` outside a
//!   string, a mismatched bracket, junk after the value) or the reply ends, the call keeps
//!   the argument text received so far. A committed call that never started its arguments
//!   gets `"{}"`. The character that broke the JSON and everything after it is processed as
//!   content, in which a following `</tool_call>` is still consumed as the call's end.
//! * **Malformed calls.** Before commitment (no name yet) nothing of the call has been
//!   emitted. If the JSON breaks first (not an object, name not a non-empty string, object
//!   closed without a name, reply ends), the call's text — from `<tool_call>` up to but not
//!   including the offending character, plus the whitespace held before it — is emitted as
//!   content, and parsing resumes as content at the offending character (so a later valid
//!   `<tool_call>` still works, and `<tool_call>not json</tool_call>` comes back verbatim).
//! * Markers that are not structural where they appear (`<tool_call>` with tools disabled,
//!   a stray `</tool_call>`, `<think>` after the start, `</think>` in content, markers inside
//!   reasoning) are literal text, emitted as an event that starts with the marker.
//!
//! # Qwen XML rules ([`OutputFormat::QwenXml`])
//!
//! * Reasoning, content, whitespace and malformed-call fallback are as for Hermes; only what
//!   follows `<tool_call>` differs. A `{` there (after whitespace) is read as a Hermes JSON call,
//!   which is how a grammar forces a call whose tool schema the XML form cannot hold to
//!   ([`crate::ModelFormat::tool_call_framing`]).
//! * **Calls**: `<tool_call>`, whitespace, `<function=NAME>`, then any number of
//!   `<parameter=KEY>VALUE</parameter>` separated by whitespace, `</function>`, whitespace,
//!   `</tool_call>`. Name and key are trimmed and may hold neither `<` nor a newline.
//! * **Commitment.** The call is committed (`ToolCallStart`) when `<function=NAME>` closes.
//!   Each parameter is emitted when its value ends, as the next member of a JSON object
//!   (`{"key": value`, then `, "key": value`, then `}`; `{}` without parameters), so the
//!   arguments are always one JSON object, streamed a parameter at a time.
//! * **Values.** One newline after `<parameter=KEY>` and one before the tag that ends the value
//!   are framing. A value ends at `</parameter>`, or where the model left it open at the next
//!   `<parameter=`, `</function>` or `</tool_call>`. The template writes strings verbatim,
//!   lists and mappings as `tojson`, other values as Python's `str()`; reading inverts that:
//!   text that is exactly a JSON value (no surrounding whitespace) is that value, verbatim;
//!   `True`, `False`, `None` are `true`, `false`, `null`; anything else is a string. Where the
//!   request's declared tools ([`ParserOptions::declared_tools`]) give the parameter the schema
//!   type `"string"`, the value is always a string.
//! * **Broken calls.** Before commitment (`<function=` missing or its name malformed, or the
//!   reply ends), the call's text is content as for Hermes. After it, text where a tag should
//!   be ends the call with the parameters so far; that text is content, and a `</tool_call>`
//!   right after (whitespace apart) is still the call's end. A malformed parameter tag ends the
//!   call too, its text `<parameter=KEY` becoming content. At the end of the reply a committed
//!   call keeps its parameters, a value being written included.
//!
//! # Llama 3 rules ([`OutputFormat::Llama3Json`])
//!
//! * With tools enabled, if the reply (after leading whitespace) starts with
//!   `<|python_tag|>` or `{`, or `<|python_tag|>` appears later in content, JSON call objects
//!   `{"name": "...", "parameters"|"arguments": {...}}` are read, several separated by `;`
//!   and whitespace (another `<|python_tag|>` may also separate them). Each object is
//!   buffered until it closes, then accepted only if it is valid JSON with a non-empty string
//!   name and an object-valued arguments key; otherwise its text (with the tag and the
//!   whitespace/`;` before it) is content and the rest of the reply is content (except a later
//!   `<|python_tag|>`). Text after accepted calls other than `;`/whitespace is content.
//! * Reasoning is not recognised.
//!
//! # Plain ([`OutputFormat::Plain`])
//!
//! Everything is content, emitted immediately.
//!
//! # Bare calls (every format, with [`ParserOptions::declared_tools`])
//!
//! A reply whose content is only a call object of a declared tool, bare or fenced, becomes that
//! call ([`recover`]); its content is held while it could still be one. The call's arguments are
//! then re-serialized JSON, not a substring of the output.

#![warn(missing_docs)]

mod emit;
mod hermes;
mod json_scan;
mod llama3;
mod markers;
pub mod recover;
mod stream;

use serde::{Deserialize, Serialize};

pub use recover::DeclaredTool;
pub use stream::StreamingParser;

/// Which output convention the model follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// Qwen2.5, Qwen3, QwQ, Hermes: `<think>…</think>` reasoning and
    /// `<tool_call>{json}</tool_call>` calls.
    Hermes,
    /// Qwen3.5, Qwen3-Coder: Hermes reasoning and content, with XML calls
    /// `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
    QwenXml,
    /// Llama 3.x: JSON objects `{"name": …, "parameters"|"arguments": {…}}`, possibly after
    /// `<|python_tag|>`, several separated by `;`.
    Llama3Json,
    /// Everything is content.
    Plain,
}

/// How to parse one reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParserOptions {
    /// The model's output convention.
    pub format: OutputFormat,
    /// The generation prompt already opened `<think>` (the template ended it with
    /// `"<think>\n"`), so the reply starts inside reasoning. Only used by
    /// [`OutputFormat::Hermes`] and [`OutputFormat::QwenXml`].
    pub starts_in_reasoning: bool,
    /// Tool call ids are `format!("{tool_call_id_prefix}{index}")`, `index` counting the
    /// reply's calls from 0, so streaming and whole parsing agree.
    pub tool_call_id_prefix: String,
    /// When false, tool-call markers are plain content.
    pub tools_enabled: bool,
    /// The tools the request declared, for replies that write a call as a bare JSON object
    /// ([`recover`]); empty turns that recovery off. [`OutputFormat::QwenXml`] also reads from
    /// their schemas which parameters are strings, which a grammar-forced XML call relies on.
    pub declared_tools: Vec<DeclaredTool>,
}

impl ParserOptions {
    /// Options for `format` with tools enabled, no open reasoning, and id prefix `"call_"`.
    pub fn new(format: OutputFormat) -> Self {
        ParserOptions {
            format,
            starts_in_reasoning: false,
            tool_call_id_prefix: "call_".to_owned(),
            tools_enabled: true,
            declared_tools: Vec::new(),
        }
    }
}

impl Default for ParserOptions {
    /// Same as `ParserOptions::new(OutputFormat::Plain)`.
    fn default() -> Self {
        ParserOptions::new(OutputFormat::Plain)
    }
}

/// One tool call found in a reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// `format!("{tool_call_id_prefix}{index}")`.
    pub id: String,
    /// The function name (JSON string decoded).
    pub name: String,
    /// The arguments as JSON text. Hermes and Llama 3: the model's raw argument text, a
    /// byte-exact substring of its output (not re-serialized; `"{}"` when a committed call
    /// gave no arguments). Qwen XML: an object built from the call's parameters.
    pub arguments: String,
}

/// A reply split into OpenAI message parts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParsedMessage {
    /// The visible answer (empty when there is none).
    pub content: String,
    /// The reasoning text; `None` when no (non-empty) reasoning was seen.
    pub reasoning_content: Option<String>,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

/// One incremental piece of a parsed reply. The parser never emits an empty text or delta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseEvent {
    /// More answer text.
    Content(String),
    /// More reasoning text.
    Reasoning(String),
    /// A tool call begins; its name is complete.
    ToolCallStart {
        /// The call's position in the reply, from 0.
        index: usize,
        /// The call's id.
        id: String,
        /// The function name.
        name: String,
    },
    /// More raw argument text of call `index`.
    ToolCallArguments {
        /// The call's position in the reply.
        index: usize,
        /// Argument text to append.
        delta: String,
    },
}

impl ParsedMessage {
    /// Accumulates events into a message: texts are concatenated, a `ToolCallStart` sets
    /// call `index`, argument deltas are appended to call `index`; an `index` past the calls
    /// seen so far adds a new call at the end (the parser numbers calls 0, 1, 2, …). `reasoning_content` is `Some` as soon as any `Reasoning` event is seen.
    pub fn from_events(events: impl IntoIterator<Item = ParseEvent>) -> ParsedMessage {
        let mut msg = ParsedMessage::default();
        for event in events {
            match event {
                ParseEvent::Content(text) => msg.content.push_str(&text),
                ParseEvent::Reasoning(text) => msg.reasoning_content.get_or_insert_with(String::new).push_str(&text),
                ParseEvent::ToolCallStart { index, id, name } => {
                    let call = msg.call_mut(index);
                    call.id = id;
                    call.name = name;
                }
                ParseEvent::ToolCallArguments { index, delta } => {
                    msg.call_mut(index).arguments.push_str(&delta);
                }
            }
        }
        msg
    }

    fn call_mut(&mut self, index: usize) -> &mut ToolCall {
        if index >= self.tool_calls.len() {
            self.tool_calls.push(ToolCall { id: String::new(), name: String::new(), arguments: String::new() });
            let last = self.tool_calls.len() - 1;
            return &mut self.tool_calls[last];
        }
        &mut self.tool_calls[index]
    }
}
