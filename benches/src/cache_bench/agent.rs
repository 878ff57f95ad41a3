//! The pieces of a coding agent's requests: its system prompt (a stable block and a dynamic
//! block), its tool definitions, and the tool calls and results it appends, all generated from a
//! seed with our own text.

use serde_json::{Value as Json, json};

use super::text::{self, Rng};

/// A tool the agent knows: its definition in `tools`, and what kind of result it returns.
#[derive(Debug, Clone, Copy)]
pub struct ToolKind {
    /// The function name.
    pub name: &'static str,
    /// What it does, for the start of its description.
    pub summary: &'static str,
    /// Its parameters: (name, JSON type).
    pub params: &'static [(&'static str, &'static str)],
    /// How its results look.
    pub result: ResultShape,
}

/// The shape of a tool's result text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultShape {
    /// Source with line numbers.
    Code,
    /// Paths or search hits.
    Listing,
    /// Compiler or test output.
    CommandOutput,
    /// Prose (a fetched page, a subagent's report).
    Prose,
}

/// The main agent's tools, in the order they are sent.
pub const MAIN_TOOLS: &[ToolKind] = &[
    ToolKind {
        name: "read_file",
        summary: "Reads a file",
        params: &[("path", "string"), ("offset", "integer"), ("limit", "integer")],
        result: ResultShape::Code,
    },
    ToolKind {
        name: "write_file",
        summary: "Writes a file",
        params: &[("path", "string"), ("content", "string")],
        result: ResultShape::CommandOutput,
    },
    ToolKind {
        name: "edit_file",
        summary: "Replaces text in a file",
        params: &[("path", "string"), ("old_string", "string"), ("new_string", "string"), ("replace_all", "boolean")],
        result: ResultShape::Code,
    },
    ToolKind {
        name: "bash",
        summary: "Runs a shell command",
        params: &[("command", "string"), ("timeout", "integer"), ("description", "string")],
        result: ResultShape::CommandOutput,
    },
    ToolKind {
        name: "grep",
        summary: "Searches file contents",
        params: &[("pattern", "string"), ("path", "string"), ("include", "string")],
        result: ResultShape::Listing,
    },
    ToolKind {
        name: "glob",
        summary: "Finds files by name",
        params: &[("pattern", "string"), ("path", "string")],
        result: ResultShape::Listing,
    },
    ToolKind {
        name: "list_directory",
        summary: "Lists a directory",
        params: &[("path", "string"), ("ignore", "array")],
        result: ResultShape::Listing,
    },
    ToolKind {
        name: "web_fetch",
        summary: "Fetches a web page",
        params: &[("url", "string"), ("format", "string")],
        result: ResultShape::Prose,
    },
    ToolKind {
        name: "todo_write",
        summary: "Updates the task list",
        params: &[("todos", "array")],
        result: ResultShape::CommandOutput,
    },
    ToolKind {
        name: "task",
        summary: "Starts a subagent",
        params: &[("description", "string"), ("prompt", "string"), ("subagent_type", "string")],
        result: ResultShape::Prose,
    },
];

/// The subagent's tools.
pub const SUBAGENT_TOOLS: &[&str] = &["read_file", "grep", "glob", "list_directory", "bash"];

/// The tool definitions for `names`, each with a generated description so that the whole set is
/// about `total_tokens` tokens. Deterministic in the seed and the names.
pub fn tool_definitions(rng: &Rng, kinds: &[ToolKind], total_tokens: usize) -> Vec<Json> {
    let per_tool = total_tokens / kinds.len().max(1);
    kinds
        .iter()
        .map(|kind| {
            let mut r = rng.fork(kind.name);
            let mut properties = serde_json::Map::new();
            for (name, ty) in kind.params {
                let mut p = json!({"type": ty, "description": text::sentence(&mut r)});
                if *ty == "array" {
                    p["items"] = json!({"type": "string"});
                }
                properties.insert((*name).to_owned(), p);
            }
            let required: Vec<&str> = kind.params.iter().take(1).map(|(n, _)| *n).collect();
            let params_tokens = text::estimate_tokens(&Json::Object(properties.clone()).to_string());
            let description = format!(
                "{}. {}\n\nUsage:\n{}",
                kind.summary,
                text::prose(&mut r, per_tool.saturating_sub(params_tokens + 40) / 2),
                text::rules(&mut r, per_tool.saturating_sub(params_tokens + 40) / 2)
            );
            json!({"type": "function", "function": {
                "name": kind.name,
                "description": description,
                "parameters": {"type": "object", "properties": properties, "required": required}
            }})
        })
        .collect()
}

/// The stable part of the main system prompt: identity and rules, identical for every session.
pub fn stable_system_block(rng: &Rng, tokens: usize) -> String {
    let mut r = rng.fork("system-stable");
    format!(
        "You are a coding agent that works in the user's repository through tools.\n\n# Rules\n{}\n# Style\n{}",
        text::rules(&mut r, tokens * 2 / 3),
        text::prose(&mut r, tokens / 3)
    )
}

/// The dynamic part: working directory, date and the folder's project instructions. Identical for
/// sessions in the same folder.
pub fn dynamic_system_block(rng: &Rng, folder: &str, tokens: usize) -> String {
    let mut r = rng.fork(&format!("system-dynamic-{folder}"));
    format!(
        "<env>\nWorking directory: /home/dev/{folder}\nIs directory a git repo: yes\nPlatform: linux\nToday's date: \
         Sun Nov 29 2026\n</env>\n# Project instructions ({folder}/AGENTS.md)\n{}",
        text::rules(&mut r, tokens.saturating_sub(50))
    )
}

/// A tool call the assistant makes: the assistant message (empty content, compact JSON arguments)
/// and the tool's result message of about `result_tokens` tokens.
pub fn tool_step(rng: &mut Rng, kind: &ToolKind, call_id: &str, result_tokens: usize) -> (Json, Json) {
    let mut args = serde_json::Map::new();
    for (name, ty) in kind.params.iter().take(2) {
        let value = match *ty {
            "integer" => json!(rng.range(1, 400)),
            "boolean" => json!(false),
            "array" => json!([format!("{}.rs", rng.pick(&["target", "node_modules", "dist"]))]),
            _ if *name == "path" => {
                json!(format!("src/{}.rs", text::sentence(rng).split(' ').next().unwrap_or("lib").to_lowercase()))
            }
            _ => json!(text::sentence(rng)),
        };
        args.insert((*name).to_owned(), value);
    }
    let call = json!({
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call_id, "type": "function", "function": {
            "name": kind.name,
            "arguments": Json::Object(args).to_string()
        }}]
    });
    let content = result_text(rng, kind.result, result_tokens);
    (call, json!({"role": "tool", "tool_call_id": call_id, "content": content}))
}

/// A tool result of about `tokens` tokens.
pub fn result_text(rng: &mut Rng, shape: ResultShape, tokens: usize) -> String {
    match shape {
        ResultShape::Code => text::code(rng, tokens),
        ResultShape::Listing => text::listing(rng, tokens),
        ResultShape::CommandOutput => text::command_output(rng, tokens),
        ResultShape::Prose => text::prose(rng, tokens),
    }
}

/// The kind named `name`.
pub fn tool_kind(name: &str) -> &'static ToolKind {
    MAIN_TOOLS.iter().find(|k| k.name == name).expect("a known tool name")
}
