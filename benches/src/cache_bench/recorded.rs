//! A workload of recorded traffic: the chat requests a real agent sent, as `radix-serve
//! --record-requests FILE` wrote them (one JSON line each, `{"route", "unix_ms", "body"}`), in
//! the order they arrived. Each is replayed with its own messages and tools; the model field,
//! sampling and `max_tokens` are the benchmark's, so every server answers the same way.
//!
//! Conversations are found from the messages: a request continues the latest earlier one whose
//! messages are a prefix of its own (the agent appended a reply and what followed), and starts
//! a conversation of its own otherwise (a new session, a title or summary request, a subagent).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value as Json;

use super::workload::{BenchRequest, RequestKind, Workload};

/// Loads the chat requests recorded in `path` as the workload `recorded`.
pub fn load(path: &Path, max_tokens: usize) -> Result<Workload> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading recorded requests {}", path.display()))?;
    let mut bodies = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let record: Json =
            serde_json::from_str(line).with_context(|| format!("{}:{}: not a JSON line", path.display(), i + 1))?;
        if record["route"] != "/v1/chat/completions" {
            continue;
        }
        let body = &record["body"];
        let Some(messages) = body["messages"].as_array() else {
            bail!("{}:{}: the recorded body has no messages array", path.display(), i + 1);
        };
        let tools = body["tools"].as_array().cloned().unwrap_or_default();
        bodies.push((messages.clone(), tools));
    }
    if bodies.is_empty() {
        bail!("{} holds no recorded chat requests", path.display());
    }
    Ok(Workload { name: "recorded".into(), requests: conversations(bodies, max_tokens) })
}

/// The requests, each assigned to the conversation it continues (see the module doc).
fn conversations(bodies: Vec<(Vec<Json>, Vec<Json>)>, max_tokens: usize) -> Vec<BenchRequest> {
    let mut requests: Vec<BenchRequest> = Vec::with_capacity(bodies.len());
    let mut conversations = 0;
    for (messages, tools) in bodies {
        let continued = requests
            .iter()
            .rev()
            .find(|r| r.messages.len() < messages.len() && messages.starts_with(&r.messages))
            .map(|r| (r.conversation.clone(), r.session));
        let first = continued.is_none();
        let (conversation, session) = continued.unwrap_or_else(|| {
            conversations += 1;
            (format!("r{}", conversations - 1), conversations - 1)
        });
        let kind = if tools.is_empty() { RequestKind::Title } else { RequestKind::Agent };
        requests.push(BenchRequest { conversation, session, kind, first, messages, tools, max_tokens });
    }
    requests
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_that_extend_an_earlier_one_continue_its_conversation() {
        let system = json!({"role": "system", "content": "agent"});
        let user = |t: &str| json!({"role": "user", "content": t});
        let reply = json!({"role": "assistant", "content": "ok"});
        let tool = json!({"type": "function", "function": {"name": "read"}});
        let bodies = vec![
            (vec![system.clone(), user("a")], vec![tool.clone()]),
            (vec![json!({"role": "system", "content": "title"}), user("a")], vec![]),
            (vec![system.clone(), user("a"), reply.clone(), user("b")], vec![tool.clone()]),
            (vec![system.clone(), user("c")], vec![tool.clone()]),
            (vec![system.clone(), user("a"), reply.clone(), user("b"), reply, user("d")], vec![tool]),
        ];
        let requests = conversations(bodies, 16);
        let ids: Vec<&str> = requests.iter().map(|r| r.conversation.as_str()).collect();
        assert_eq!(ids, ["r0", "r1", "r0", "r2", "r0"]);
        let first: Vec<bool> = requests.iter().map(|r| r.first).collect();
        assert_eq!(first, [true, true, false, true, false]);
        assert_eq!(requests[1].kind, RequestKind::Title);
        assert!(requests.iter().all(|r| r.max_tokens == 16));
    }

    #[test]
    fn a_file_without_chat_requests_is_an_error() {
        let path = std::env::temp_dir().join(format!("recorded-empty-{}.jsonl", std::process::id()));
        std::fs::write(&path, "{\"route\": \"/v1/completions\", \"body\": {}}\n").unwrap();
        let err = load(&path, 16).unwrap_err().to_string();
        assert!(err.contains("no recorded chat requests"), "{err}");
        let _ = std::fs::remove_file(&path);
    }
}
