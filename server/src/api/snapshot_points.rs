//! Snapshot points of a chat prompt: the token positions where a hybrid model's engine saves
//! the recurrent state (`GenerateRequest::snapshot_points`), because a later request of the
//! same conversation is likely to diverge there.
//!
//! A hybrid model can reuse a cached prefix only up to the last saved state at or before the
//! point where the next prompt diverges, so the points that matter are where agents' prompts
//! diverge from their history: at message boundaries. The points, as bytes of the prompt:
//! - the end of the tools block (what the prompt gains when rendered with `tools`): a request
//!   with the same tools but another system text (Qwen3.5 renders the tools first, inside the
//!   system message) keeps everything before it;
//! - each message's header start, i.e. the last control token at or before its text that
//!   follows the previous message's text: a new turn, a tool result, an edited message start
//!   there, and so does the one place where a template re-renders history, the reasoning it
//!   drops from turns older than the latest user query (Qwen3, Qwen3.5: the turn changes right
//!   after its header). A control token is always a token of its own, so the byte position is
//!   a token boundary in both prompts whatever follows it;
//! - where no control token separates a message from the previous one (leading system
//!   messages merged into one block), the message text's start: OpenCode's second system
//!   message holds the working directory, and a session in another folder keeps the first;
//! - where what follows the last message begins (the next request may go on in the same turn:
//!   Qwen3.5 renders consecutive tool results in one user turn), and the header of the reply's
//!   turn (the next request goes on after the reply, with what the template writes after the
//!   header changed, e.g. `<think>` opened or dropped).
//!
//! No point goes inside an assistant message at its reasoning: a template that drops reasoning
//! drops it from the header on, so the next prompt has diverged before it; one that keeps it
//! renders the turn alike, and a point there would cost a snapshot no later prompt stops at.
//!
//! A byte position maps to the tokens that end at or before it: a token straddling it holds
//! text on both sides, so the state after it is not the state at the boundary. The engine
//! rounds the points down to its pages and adds its own (fixed intervals, prompt end,
//! generation end); messages are found as the prompt's parts find them (`prompt_parts.rs`).

use std::ops::Range;

use radix_templates::ChatRequest;
use radix_templates::prepare::{ControlSpellings, PreparedTemplate, RenderedPrompt};
use serde_json::Value as Json;

use super::cache_report::message_text;
use super::prompt_parts::{find_messages, tools_span};

/// The snapshot points of a chat prompt: token positions, ascending, each in
/// `1..offsets.len()`. `chat` is the request `rendered` was rendered from, `offsets` the byte
/// offset where each of its tokens starts (`Tokenizer::encode_prompt_with_offsets`), and
/// `controls` the tokenizer's control-token spellings (without them, messages start at their
/// text). Costs one render more when the request has tools.
pub(crate) fn snapshot_points(
    template: &PreparedTemplate,
    chat: &ChatRequest,
    rendered: &RenderedPrompt,
    offsets: &[usize],
    controls: Option<&ControlSpellings>,
) -> Vec<usize> {
    let bytes = boundaries(template, chat, rendered, controls);
    token_positions(&bytes, offsets, rendered.text.len())
}

/// The byte positions of the points (see the module docs), unordered and possibly repeated.
fn boundaries(
    template: &PreparedTemplate,
    chat: &ChatRequest,
    rendered: &RenderedPrompt,
    controls: Option<&ControlSpellings>,
) -> Vec<usize> {
    let text = &rendered.text;
    // A control token the request's own text spelled is encoded as text and opens no turn.
    let controls: Vec<Range<usize>> = controls
        .map_or(Vec::new(), |c| c.find_in(text))
        .into_iter()
        .filter(|r| !rendered.content_controls.contains(r))
        .collect();
    let mut points = Vec::with_capacity(chat.messages.len() + 3);
    points.extend(tools_span(template, chat, text).map(|tools| tools.end));
    // Searched from the previous text's end, not from the control token after it as the parts
    // do: a merged system message follows the previous one with no control token between.
    let found = find_messages(text, chat.messages.iter().map(anchors), |end| end);
    let mut previous_end = 0;
    for range in found.into_iter().flatten() {
        points.push(header(&controls, previous_end, range.start));
        previous_end = range.end;
    }
    let next = controls.partition_point(|c| c.start < previous_end);
    let generation = controls.get(next).map_or(previous_end, |c| c.start);
    points.push(generation);
    points.extend(controls[next..].last().map(|c| c.start));
    points
}

/// The texts that may mark where a message is, as [`find_messages`] takes them: its text, and
/// for an assistant turn what a template may render of it where it does not render the text
/// verbatim (the content after inline reasoning it splits off; the first tool call's name
/// where it writes the arguments in its own syntax, as Qwen3.5's XML calls do; the reasoning).
fn anchors(message: &Json) -> Vec<String> {
    let text = message_text(message);
    let mut anchors = Vec::new();
    if let Some((_, after)) = text.rsplit_once("</think>") {
        anchors.push(after.trim().to_owned());
    }
    anchors.push(text);
    if message["role"] == "assistant" {
        let calls = message["tool_calls"].as_array().into_iter().flatten();
        anchors.extend(calls.filter_map(|c| c["function"]["name"].as_str()).take(1).map(str::to_owned));
        let reasoning = ["reasoning_content", "reasoning", "thinking"].iter().find_map(|k| message[k].as_str());
        anchors.extend(reasoning.map(|r| r.trim().to_owned()));
    }
    anchors
}

/// Where the message whose text starts at `text_start` begins: the last control token (of the
/// sorted `controls`) between `after` (the previous message's text end) and its text, or the
/// text itself where none is.
fn header(controls: &[Range<usize>], after: usize, text_start: usize) -> usize {
    let before = controls.partition_point(|c| c.end <= text_start);
    controls[..before].last().filter(|c| c.start >= after).map_or(text_start, |c| c.start)
}

/// Token positions of byte `boundaries` in a text of `text_len` bytes whose tokens start at
/// `offsets`: each is the number of tokens that end at or before it. Ascending, without
/// repeats, and only those strictly inside the prompt (0 and the whole prompt save nothing the
/// engine does not).
fn token_positions(boundaries: &[usize], offsets: &[usize], text_len: usize) -> Vec<usize> {
    let Some(ends) = offsets.get(1..) else { return Vec::new() };
    let mut points: Vec<usize> = boundaries
        .iter()
        .map(|&b| ends.partition_point(|&end| end <= b) + usize::from(b >= text_len))
        .filter(|&t| t > 0 && t < offsets.len())
        .collect();
    points.sort_unstable();
    points.dedup();
    points
}

#[cfg(test)]
mod tests;
