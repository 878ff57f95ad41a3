//! Where a rendered chat prompt's pieces are: each message's text, the tool schemas and the
//! leading system block (what follows the last message is the generation prompt). Snapshot
//! points (`snapshot_points.rs`), the prompt's parts (`prompt_parts.rs`) and the cache report
//! (`cache_report.rs`) all read one [`PromptStructure`], made once per request next to the
//! prompt's own render. The tool schemas cost a render of their own (the request without them):
//! made the first time a reader asks, at most once, and not at all for a dense model's request
//! whose reuse went as far as expected (nobody asks).
//!
//! Messages are found by their text, in order (a template renders each message's content
//! verbatim, wherever it puts headers, merged system blocks or dropped reasoning); each reader
//! decides where a message's header and the generation prompt begin, since they draw the lines
//! for different ends (a token boundary, a cache part, a place in the conversation).

use std::ops::Range;
use std::sync::OnceLock;

use radix_templates::ChatRequest;
use radix_templates::prepare::PreparedTemplate;
use serde_json::Value as Json;

/// The pieces of one rendered chat prompt.
#[derive(Debug, Clone)]
pub(crate) struct PromptStructure {
    /// The template that rendered the prompt, to render it without its tools when asked.
    template: PreparedTemplate,
    /// The tool schemas' bytes ([`PromptStructure::tools`]), once asked for.
    tools: OnceLock<Option<Range<usize>>>,
    /// Each message's text ([`message_text`]), what finds it in the prompt.
    pub(crate) texts: Vec<String>,
    /// Where each message's text is, searched from where the previous one found ends
    /// ([`find_messages`]); `None` where it is not rendered verbatim (or is empty).
    pub(crate) messages: Vec<Option<Range<usize>>>,
    /// How many messages open the conversation as system (or developer) messages.
    pub(crate) leading_system: usize,
}

impl PromptStructure {
    /// The structure of `prompt_text`, which `template` rendered from `chat`.
    pub(crate) fn new(template: &PreparedTemplate, chat: &ChatRequest, prompt_text: &str) -> Self {
        let texts: Vec<String> = chat.messages.iter().map(message_text).collect();
        let messages = find_messages(prompt_text, texts.iter().map(|t| [t]), |end| end);
        let leading_system =
            chat.messages.iter().take_while(|m| matches!(m["role"].as_str(), Some("system" | "developer"))).count();
        PromptStructure { template: template.clone(), tools: OnceLock::new(), texts, messages, leading_system }
    }

    /// The tool schemas' bytes: what the prompt gains over the same request rendered without
    /// its tools (`None` without tools, or where it gains nothing). `chat` and `prompt_text` are
    /// the request and the prompt the structure was made from.
    pub(crate) fn tools(&self, chat: &ChatRequest, prompt_text: &str) -> Option<Range<usize>> {
        self.tools.get_or_init(|| tools_span(&self.template, chat, prompt_text)).clone()
    }
}

/// Where each message is in `prompt_text`: the byte range of the earliest occurrence of any
/// of its `texts`, `None` where none occurs (not rendered verbatim, or empty). Messages are
/// searched in order, each from `resume(end)` of the last one found, so that text a later
/// message repeats is not taken for an earlier one's; a template renders each message's text
/// verbatim, wherever it puts headers, merged system blocks or dropped reasoning.
pub(crate) fn find_messages<T: AsRef<str>>(
    prompt_text: &str,
    texts: impl IntoIterator<Item = impl IntoIterator<Item = T>>,
    resume: impl Fn(usize) -> usize,
) -> Vec<Option<Range<usize>>> {
    let mut from = 0;
    let mut out = Vec::new();
    for candidates in texts {
        let mut best: Option<Range<usize>> = None;
        for text in candidates {
            let text = text.as_ref();
            // Only a match that starts before the best one so far counts: the search stops
            // there, not at the prompt's end (a dropped reasoning text is found nowhere).
            let limit = best.as_ref().map_or(prompt_text.len(), |b| (b.start + text.len()).saturating_sub(1));
            let limit = (0..=limit.min(prompt_text.len())).rev().find(|&i| prompt_text.is_char_boundary(i));
            let window = limit.and_then(|limit| prompt_text.get(from..limit)).unwrap_or_default();
            if let Some(at) = window.find(text).filter(|_| !text.is_empty()) {
                best = Some(from + at..from + at + text.len());
            }
        }
        if let Some(range) = &best {
            from = resume(range.end);
        }
        out.push(best);
    }
    out
}

/// The tool schemas' bytes: what `prompt_text` gains over the same request rendered without
/// its tools (`None` without tools, or where it gains nothing).
fn tools_span(template: &PreparedTemplate, chat: &ChatRequest, prompt_text: &str) -> Option<Range<usize>> {
    if chat.tools.as_ref().is_none_or(|t| t.is_empty()) {
        return None;
    }
    let without = template.render(&ChatRequest { tools: None, ..chat.clone() }).ok()?;
    let at = common_bytes(&without, prompt_text);
    let added = prompt_text.len().saturating_sub(without.len());
    (added > 0).then_some(at..at + added)
}

/// The text a message carries: its content (text parts joined), else its tool-call arguments.
pub(crate) fn message_text(message: &Json) -> String {
    match &message["content"] {
        Json::String(s) if !s.trim().is_empty() => return s.trim().to_owned(),
        Json::Array(parts) => {
            let text: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
            if !text.is_empty() {
                return text.join("\n").trim().to_owned();
            }
        }
        _ => {}
    }
    message["tool_calls"]
        .as_array()
        .and_then(|calls| calls.first())
        .and_then(|c| c["function"]["arguments"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Bytes two strings share at their start, cut to a character boundary.
pub(crate) fn common_bytes(a: &str, b: &str) -> usize {
    let n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    floor_char_boundary(a, n)
}

/// The largest character boundary of `s` at or before `i`.
pub(crate) fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn message_text_takes_content_parts_or_arguments() {
        assert_eq!(message_text(&json!({"role": "user", "content": " hi "})), "hi");
        assert_eq!(message_text(&json!({"content": [{"type": "text", "text": "a"}, {"text": "b"}]})), "a\nb");
        let call = json!({"content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{\"x\":1}"}}]});
        assert_eq!(message_text(&call), "{\"x\":1}");
    }

    #[test]
    fn common_bytes_stops_on_a_character_boundary() {
        assert_eq!(common_bytes("abé", "abè"), 2);
        assert_eq!(common_bytes("abc", "abd"), 2);
        assert_eq!(common_bytes("ab", "abc"), 2);
    }
}
