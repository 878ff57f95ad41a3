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
//! - inside a system message, the start of an `<env>` block (OpenCode's and Claude Code's
//!   working directory, platform and date), where one system text does both jobs;
//! - where what follows the last message begins (the next request may go on in the same turn:
//!   Qwen3.5 renders consecutive tool results in one user turn), and the header of the reply's
//!   turn (the next request goes on after the reply, with what the template writes after the
//!   header changed, e.g. `<think>` opened or dropped).
//!
//! No point goes inside an assistant message at its reasoning: a template that drops reasoning
//! drops it from the header on, so the next prompt has diverged before it; one that keeps it
//! renders the turn alike, and a point there would cost a snapshot no later prompt stops at.
//!
//! Some of these are *expected* points, where a later request is expected to resume, and the
//! engine keeps their snapshots over the others (`engine/radix/snapshots.rs`): the system
//! block's (the tools end, each system message, the `<env>` block, the first message after
//! the system block; sessions and subagents share them), the reply's header, and where
//! the next user turn diverges. That last one is found by rendering the request with one more
//! user message: a template that re-renders history when a new user query arrives (Qwen3.5
//! drops the reasoning of every turn before it) diverges from this prompt inside the history,
//! and the next turn resumes there or at the header of the message it diverges in. Every other
//! message header is needed only until the conversation's next request goes past it.
//!
//! Branch points (`GenerateRequest::branch_points`) are candidates, not points: every line start
//! inside the leading system block (the tool definitions, one a line in Qwen's templates, and
//! the system text). Other agents branch from this prompt inside that block: a subagent whose
//! tools are the main agent's first few, a project whose instructions word one paragraph
//! differently. The engine keeps some of them, a few hundred tokens apart (`--branch-spacing`).
//!
//! A byte position maps to the tokens that end at or before it: a token straddling it holds
//! text on both sides, so the state after it is not the state at the boundary. The engine
//! rounds the points down to its pages and adds its own (fixed intervals, prompt end,
//! generation end); messages are found as the prompt's parts find them (`prompt_structure.rs`).

use std::ops::Range;

use radix_templates::ChatRequest;
use radix_templates::prepare::{ControlSpellings, PreparedTemplate, RenderedPrompt};
use serde_json::Value as Json;

use super::prompt_structure::{PromptStructure, common_bytes, find_messages, message_text};

/// A chat prompt's snapshot points, as token positions, ascending, each in `1..tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SnapshotPoints {
    /// Every point (`GenerateRequest::snapshot_points`).
    pub all: Vec<usize>,
    /// Those where a later request is expected to resume (`GenerateRequest::expected_points`).
    pub expected: Vec<usize>,
    /// Line starts inside the leading system block (`GenerateRequest::branch_points`).
    pub branch: Vec<usize>,
}

/// The snapshot points of a chat prompt. `chat` is the request `rendered` was rendered from,
/// `offsets` the byte offset where each of its tokens starts
/// (`Tokenizer::encode_prompt_with_offsets`), and `controls` the tokenizer's control-token
/// spellings (without them, messages start at their text); `structure` is the prompt's
/// ([`PromptStructure::new`]). Costs one render more.
pub(crate) fn snapshot_points(
    template: &PreparedTemplate,
    structure: &PromptStructure,
    chat: &ChatRequest,
    rendered: &RenderedPrompt,
    offsets: &[usize],
    controls: Option<&ControlSpellings>,
) -> SnapshotPoints {
    let (points, system_end) = boundaries(template, structure, chat, rendered, controls);
    let positions = |expected_only: bool| {
        let bytes: Vec<usize> = points.iter().filter(|p| p.expected || !expected_only).map(|p| p.byte).collect();
        token_positions(&bytes, offsets, rendered.text.len())
    };
    let branch = token_positions(&line_starts(&rendered.text[..system_end]), offsets, rendered.text.len());
    SnapshotPoints { all: positions(false), expected: positions(true), branch }
}

/// Where each line of `text` after the first starts: inside the leading system block these are
/// where other agents' prompts branch from this one (the next tool definition, a paragraph of
/// instructions another project or a subagent words differently).
fn line_starts(text: &str) -> Vec<usize> {
    text.match_indices('\n').map(|(i, _)| i + 1).filter(|&i| i < text.len()).collect()
}

/// A point as a byte of the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BytePoint {
    byte: usize,
    /// A later request is expected to resume here (see the module docs).
    expected: bool,
}

/// The points (see the module docs), unordered and possibly repeated, and where the leading
/// system block (tools, system messages) ends: the header of the first other message.
fn boundaries(
    template: &PreparedTemplate,
    structure: &PromptStructure,
    chat: &ChatRequest,
    rendered: &RenderedPrompt,
    controls: Option<&ControlSpellings>,
) -> (Vec<BytePoint>, usize) {
    let text = &rendered.text;
    // A control token the request's own text spelled is encoded as text and opens no turn.
    let controls: Vec<Range<usize>> = controls
        .map_or(Vec::new(), |c| c.find_in(text))
        .into_iter()
        .filter(|r| !rendered.content_controls.contains(r))
        .collect();
    let expected = |byte| BytePoint { byte, expected: true };
    let mut points = Vec::with_capacity(chat.messages.len() + 5);
    points.extend(structure.tools(chat, text).map(|tools| expected(tools.end)));
    // Searched from the previous text's end, not from the control token after it as the parts
    // do: a merged system message follows the previous one with no control token between.
    let found = find_messages(text, chat.messages.iter().map(anchors), |end| end);
    let mut headers = Vec::with_capacity(found.len());
    let mut in_system_block = true;
    let mut system_end = None;
    let mut previous_end = 0;
    for (message, range) in chat.messages.iter().zip(found) {
        let Some(range) = range else { continue };
        let system = message["role"] == "system";
        let at = header(&controls, previous_end, range.start);
        // The first message after the system block ends what sessions share.
        points.push(BytePoint { byte: at, expected: in_system_block });
        if in_system_block && !system {
            system_end = Some(at);
        }
        in_system_block &= system;
        if system {
            points.extend(text[range.clone()].match_indices(ENV_BLOCK).map(|(i, _)| expected(range.start + i)));
        }
        headers.push(at);
        previous_end = range.end;
    }
    let next = controls.partition_point(|c| c.start < previous_end);
    let generation = controls.get(next).map_or(previous_end, |c| c.start);
    points.push(BytePoint { byte: generation, expected: false });
    points.extend(controls[next..].last().map(|c| expected(c.start)));
    if let Some(diverges) = next_user_turn_divergence(template, chat, text).filter(|&d| d < previous_end) {
        // The divergence itself (where an earlier request's generation-prompt snapshot may lie)
        // and the header of its message.
        points.push(expected(diverges));
        let resumes = headers.partition_point(|&h| h <= diverges);
        points.extend(headers[..resumes].last().map(|&h| expected(h)));
    }
    (points, system_end.unwrap_or(previous_end))
}

/// How an environment block opens in a system prompt (OpenCode, Claude Code).
const ENV_BLOCK: &str = "<env>";

/// The first byte where `prompt_text` and the same request with one more user message differ:
/// where the conversation's next user turn diverges from this prompt (`None` if the template
/// does not render the longer request).
fn next_user_turn_divergence(template: &PreparedTemplate, chat: &ChatRequest, prompt_text: &str) -> Option<usize> {
    let mut messages = chat.messages.clone();
    // A chat message as the template reads it (messages are JSON values there), not a response.
    messages.push(serde_json::json!({"role": "user", "content": "?"}));
    let next = template.render(&ChatRequest { messages, ..chat.clone() }).ok()?;
    Some(common_bytes(&next, prompt_text))
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
