//! Agent-shaped workloads, generated deterministically from a seed: the coding-agent session, the
//! same with a split system prompt, interleaved sessions in two folders, a subagent, and
//! compaction; and two whose prompts branch inside the system block, where no message boundary
//! is (a subagent sharing the main agent's first tools and rules, a session whose instructions
//! differ in one paragraph).
//!
//! Within one conversation every request's messages are the previous request's messages, then
//! the assistant's reply, then what the agent appends (tool results, a user turn): append-only, as
//! real agents behave. The reply is scripted rather than taken from the model, so the workload is
//! the same for every server and every run.

use serde::Serialize;
use serde_json::{Value as Json, json};

use super::agent::{self, MAIN_TOOLS, SUBAGENT_TOOLS, ToolKind};
use super::text::{self, Rng};

/// Sizes of a workload's parts, in approximate tokens.
#[derive(Debug, Clone, Serialize)]
pub struct Sizes {
    /// The main system prompt, both blocks.
    pub system_tokens: usize,
    /// The share of the system prompt that is the dynamic block (cwd, date, project rules).
    pub dynamic_share: f64,
    /// All tool definitions together.
    pub tools_tokens: usize,
    /// The title generator's own system prompt.
    pub title_system_tokens: usize,
    /// The subagent's system prompt.
    pub subagent_system_tokens: usize,
    /// User turns per session (each followed by tool steps and an answer).
    pub user_turns: usize,
    /// Tool steps per user turn, inclusive range.
    pub steps: (usize, usize),
    /// Tool result size, inclusive range (log-uniform).
    pub tool_result: (usize, usize),
    /// A user message.
    pub user_tokens: usize,
    /// The assistant's final answer of a turn.
    pub answer_tokens: usize,
    /// The summary that replaces the history on compaction.
    pub summary_tokens: usize,
    /// A conversation stops growing before its estimated prompt passes this.
    pub max_prompt_tokens: usize,
    /// `max_tokens` of every request.
    pub max_tokens: usize,
    /// Sessions of the interleaved workload.
    pub sessions: usize,
}

impl Sizes {
    /// Measured agent traffic: ~2.1k system, ~5k of tools, results of 100-3,000 tokens; for a
    /// model with a 32k context (the Qwen3-0.6B-shaped model).
    pub fn full() -> Self {
        Sizes {
            // Our prose estimates run ~8% high: 2,250 estimated is ~2,100 Qwen3 tokens.
            system_tokens: 2250,
            dynamic_share: 0.15,
            tools_tokens: 5000,
            title_system_tokens: 500,
            subagent_system_tokens: 1200,
            user_turns: 4,
            steps: (2, 4),
            tool_result: (100, 3000),
            user_tokens: 60,
            answer_tokens: 150,
            summary_tokens: 400,
            max_prompt_tokens: 30_000,
            max_tokens: 16,
            sessions: 4,
        }
    }

    /// The prompt's fixed parts (system prompts, tools) times `prefix_factor`, the growing parts
    /// (tool results, messages, answers) times `content_factor`, and a prompt limit of
    /// `max_prompt_tokens`; counts stay.
    pub fn scaled(prefix_factor: f64, content_factor: f64, max_prompt_tokens: usize) -> Self {
        let s = Self::full();
        let by = |factor: f64| move |n: usize| ((n as f64 * factor).round() as usize).max(1);
        let (p, c) = (by(prefix_factor), by(content_factor));
        Sizes {
            system_tokens: p(s.system_tokens),
            tools_tokens: p(s.tools_tokens),
            title_system_tokens: p(s.title_system_tokens),
            subagent_system_tokens: p(s.subagent_system_tokens),
            tool_result: (c(s.tool_result.0), c(s.tool_result.1)),
            user_tokens: c(s.user_tokens),
            answer_tokens: c(s.answer_tokens),
            summary_tokens: c(s.summary_tokens),
            max_prompt_tokens,
            ..s
        }
    }

    /// The variant for SmolLM2-135M's 8,192-token context: a ~3.2k-token prefix and results of
    /// 20-600 tokens, so that a session still runs ~20 requests before the context is full.
    pub fn smollm2() -> Self {
        Sizes { user_turns: 8, ..Self::scaled(0.4, 0.2, 6800) }
    }
}

/// What a request is, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// The short title-generation request at a session's start.
    Title,
    /// A main agent turn (with tools).
    Agent,
    /// A subagent turn.
    Subagent,
    /// The compaction summary request (no tools).
    Summary,
}

/// One request of a workload.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRequest {
    /// The conversation it belongs to: requests of one conversation are append-only.
    pub conversation: String,
    /// The session (agent window) it belongs to.
    pub session: usize,
    /// What it is.
    pub kind: RequestKind,
    /// The first request of its conversation (a "cold" request in the report).
    pub first: bool,
    /// The chat messages.
    pub messages: Vec<Json>,
    /// The tool definitions (empty: none sent).
    pub tools: Vec<Json>,
    /// `max_tokens`.
    pub max_tokens: usize,
}

/// A named list of requests, replayed in order.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    /// Its name (one of [`WORKLOADS`]).
    pub name: String,
    /// The requests in the order they are sent.
    pub requests: Vec<BenchRequest>,
}

/// Every workload's name, in report order.
pub const WORKLOADS: &[&str] =
    &["single", "split-system", "interleaved", "subagent", "compaction", "subagent-branch", "edited-system"];

/// Builds the workload `name` for `seed` and `sizes`; `None` for an unknown name.
pub fn build(name: &str, seed: u64, sizes: &Sizes) -> Option<Workload> {
    let root = Rng::new(seed);
    let requests = match name {
        "single" => coding_session(&root, sizes, 0, "project", false),
        "split-system" => coding_session(&root, sizes, 0, "project", true),
        "interleaved" => {
            let sessions: Vec<Vec<BenchRequest>> = (0..sizes.sessions)
                .map(|i| coding_session(&root, sizes, i, if i % 2 == 0 { "project" } else { "other-project" }, false))
                .collect();
            interleave(&mut root.fork("schedule"), sessions)
        }
        "subagent" => subagent_session(&root, sizes, false),
        "subagent-branch" => subagent_session(&root, sizes, true),
        "edited-system" => {
            let sessions = vec![coding_session(&root, sizes, 0, "project", false), edited_session(&root, sizes, 1)];
            interleave(&mut root.fork("schedule"), sessions)
        }
        "compaction" => compaction_session(&root, sizes),
        _ => return None,
    };
    Some(Workload { name: name.to_owned(), requests })
}

/// Sends the sessions' requests in a random (seeded) order that keeps each session's own order.
fn interleave(rng: &mut Rng, sessions: Vec<Vec<BenchRequest>>) -> Vec<BenchRequest> {
    let mut queues: Vec<std::collections::VecDeque<BenchRequest>> = sessions.into_iter().map(Into::into).collect();
    let mut out = Vec::new();
    loop {
        let open: Vec<usize> = (0..queues.len()).filter(|&i| !queues[i].is_empty()).collect();
        if open.is_empty() {
            return out;
        }
        let i = *rng.pick(&open);
        out.extend(queues[i].pop_front());
    }
}

/// One growing conversation: its messages and the requests sent so far.
struct Conversation {
    id: String,
    session: usize,
    kind: RequestKind,
    messages: Vec<Json>,
    tools: Vec<Json>,
    tools_estimate: usize,
    sent: usize,
}

impl Conversation {
    fn new(id: String, session: usize, kind: RequestKind, messages: Vec<Json>, tools: Vec<Json>) -> Self {
        let tools_estimate = text::estimate_tokens(&Json::Array(tools.clone()).to_string());
        Conversation { id, session, kind, messages, tools, tools_estimate, sent: 0 }
    }

    fn estimate(&self) -> usize {
        self.tools_estimate
            + self
                .messages
                .iter()
                .map(|m| {
                    8 + text::estimate_tokens(m.get("content").and_then(Json::as_str).unwrap_or_default())
                        + m.get("tool_calls").map_or(0, |c| text::estimate_tokens(&c.to_string()))
                })
                .sum::<usize>()
    }

    fn request(&mut self, sizes: &Sizes) -> BenchRequest {
        self.sent += 1;
        BenchRequest {
            conversation: self.id.clone(),
            session: self.session,
            kind: self.kind,
            first: self.sent == 1,
            messages: self.messages.clone(),
            tools: self.tools.clone(),
            max_tokens: sizes.max_tokens,
        }
    }

    /// Whether `more` tokens still fit under the prompt limit, with room for the answer.
    fn fits(&self, more: usize, sizes: &Sizes) -> bool {
        // The estimate misses template tokens and tokenizer differences: keep a tenth spare.
        (self.estimate() + more + sizes.answer_tokens + sizes.max_tokens) * 11 / 10 <= sizes.max_prompt_tokens
    }

    /// One user turn: the user message, then tool steps, each a request followed by the call and
    /// its result, then a request answered with text. Stops early when the prompt would not fit.
    /// Returns false once the conversation is full.
    fn user_turn(
        &mut self,
        rng: &mut Rng,
        sizes: &Sizes,
        tools: &[ToolKind],
        user: String,
        out: &mut Vec<BenchRequest>,
    ) -> bool {
        if !self.fits(text::estimate_tokens(&user), sizes) {
            return false;
        }
        self.messages.push(json!({"role": "user", "content": user}));
        let steps = rng.range(sizes.steps.0, sizes.steps.1);
        let mut full = false;
        for _ in 0..steps {
            let kind = rng.pick(tools);
            let result_tokens = rng.log_range(sizes.tool_result.0, sizes.tool_result.1);
            if !self.fits(result_tokens + 40, sizes) {
                full = true;
                break;
            }
            out.push(self.request(sizes));
            let (call, result) = agent::tool_step(
                rng,
                kind,
                &format!("call_{}_{}", self.id.replace('/', "_"), self.sent),
                result_tokens,
            );
            self.messages.push(call);
            self.messages.push(result);
        }
        out.push(self.request(sizes));
        self.messages.push(json!({"role": "assistant", "content": text::prose(rng, sizes.answer_tokens)}));
        !full
    }
}

fn main_system(root: &Rng, sizes: &Sizes, folder: &str, split: bool) -> Vec<Json> {
    let dynamic_tokens = (sizes.system_tokens as f64 * sizes.dynamic_share).round() as usize;
    let stable = agent::stable_system_block(root, sizes.system_tokens - dynamic_tokens);
    let dynamic = agent::dynamic_system_block(root, folder, dynamic_tokens);
    if split {
        vec![json!({"role": "system", "content": stable}), json!({"role": "system", "content": dynamic})]
    } else {
        vec![json!({"role": "system", "content": format!("{stable}\n\n{dynamic}")})]
    }
}

fn user_message(rng: &mut Rng, sizes: &Sizes) -> String {
    text::prose(rng, sizes.user_tokens)
}

/// The title request: its own system prompt and the first user message, no tools.
fn title_request(root: &Rng, sizes: &Sizes, session: usize, first_user: &str) -> BenchRequest {
    let mut r = root.fork("title-system");
    let system = format!(
        "You write a short title for a conversation. Reply with the title only.\n{}",
        text::rules(&mut r, sizes.title_system_tokens)
    );
    let messages = vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": first_user})];
    let mut c = Conversation::new(format!("s{session}/title"), session, RequestKind::Title, messages, Vec::new());
    c.request(sizes)
}

/// A coding-agent session: a title request, then user turns of tool steps.
fn coding_session(root: &Rng, sizes: &Sizes, session: usize, folder: &str, split: bool) -> Vec<BenchRequest> {
    coding_session_with(root, sizes, session, main_system(root, sizes, folder, split))
}

/// A coding-agent session in the same folder whose stable instructions differ in one rule in
/// their middle (another version of the agent, a tool's instructions reworded): it shares the
/// tools and the system text up to that line with the others.
fn edited_session(root: &Rng, sizes: &Sizes, session: usize) -> Vec<BenchRequest> {
    let mut system = main_system(root, sizes, "project", false);
    let text = system[0]["content"].as_str().unwrap_or_default();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let rules: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].starts_with("- ")).collect();
    if let Some(&middle) = rules.get(rules.len() / 2) {
        lines[middle] = format!("- {}", text::sentence(&mut root.fork("edited-rule")));
    }
    system[0]["content"] = Json::from(lines.join("\n"));
    coding_session_with(root, sizes, session, system)
}

/// A coding-agent session with the system messages `system`.
fn coding_session_with(root: &Rng, sizes: &Sizes, session: usize, system: Vec<Json>) -> Vec<BenchRequest> {
    let mut rng = root.fork(&format!("session-{session}"));
    let tools = agent::tool_definitions(root, MAIN_TOOLS, sizes.tools_tokens);
    let first_user = user_message(&mut rng, sizes);
    let mut out = vec![title_request(root, sizes, session, &first_user)];
    let mut c = Conversation::new(format!("s{session}"), session, RequestKind::Agent, system, tools);
    let usable: Vec<ToolKind> = MAIN_TOOLS.iter().copied().filter(|k| k.name != "task").collect();
    let mut user = first_user;
    for _ in 0..sizes.user_turns {
        if !c.user_turn(&mut rng, sizes, &usable, user, &mut out) {
            break;
        }
        user = user_message(&mut rng, sizes);
    }
    out
}

/// A main session that hands a task to a subagent and continues with the subagent's report as
/// the `task` tool's result. The subagent has its own system prompt and five tools, or with
/// `branch` (as OpenCode's general subagent) the main agent's tools but the last two and the
/// main rules' first half before its own: its prompt branches from the main agent's inside the
/// system block (in the tools where a template writes them first, else in the rules).
fn subagent_session(root: &Rng, sizes: &Sizes, branch: bool) -> Vec<BenchRequest> {
    let mut rng = root.fork("subagent-main");
    let main_tools = agent::tool_definitions(root, MAIN_TOOLS, sizes.tools_tokens);
    let first_user = user_message(&mut rng, sizes);
    let mut out = vec![title_request(root, sizes, 0, &first_user)];
    let mut main =
        Conversation::new("s0".into(), 0, RequestKind::Agent, main_system(root, sizes, "project", false), main_tools);
    let usable: Vec<ToolKind> = MAIN_TOOLS.iter().copied().filter(|k| k.name != "task").collect();
    main.user_turn(&mut rng, sizes, &usable, first_user, &mut out);

    // The main agent delegates: the request, its `task` call, then the subagent's whole run.
    main.messages.push(json!({"role": "user", "content": user_message(&mut rng, sizes)}));
    out.push(main.request(sizes));
    let task_prompt = text::prose(&mut rng, sizes.user_tokens * 3);
    let call_id = format!("call_s0_task_{}", main.sent);
    main.messages.push(json!({"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function",
        "function": {"name": "task", "arguments": json!({"description": "Investigate", "prompt": task_prompt, "subagent_type": "general"}).to_string()}}]}));

    let mut r = root.fork("subagent-system");
    let (sub_kinds, sub_tools, sub_system) = if branch {
        let kinds = &MAIN_TOOLS[..MAIN_TOOLS.len() - 2];
        // The same size a tool as the main agent's, so the shared ones are the same text.
        let tokens = sizes.tools_tokens * kinds.len() / MAIN_TOOLS.len();
        let main = main_system(root, sizes, "project", false);
        let lines: Vec<&str> = main[0]["content"].as_str().unwrap_or_default().lines().collect();
        let shared = lines[..lines.len() / 2].join("\n");
        let own = text::rules(&mut r, sizes.subagent_system_tokens / 2);
        (kinds.to_vec(), agent::tool_definitions(root, kinds, tokens), format!("{shared}\n# Subagent\n{own}"))
    } else {
        let kinds: Vec<ToolKind> = SUBAGENT_TOOLS.iter().map(|n| *agent::tool_kind(n)).collect();
        let tools = agent::tool_definitions(&root.fork("subagent"), &kinds, sizes.tools_tokens / 2);
        let system = format!(
            "You are a subagent. Investigate the task you are given with read-only tools and report back.\n{}",
            text::rules(&mut r, sizes.subagent_system_tokens)
        );
        (kinds, tools, system)
    };
    let mut sub = Conversation::new(
        "s0/sub".into(),
        0,
        RequestKind::Subagent,
        vec![json!({"role": "system", "content": sub_system})],
        sub_tools,
    );
    sub.user_turn(&mut rng, sizes, &sub_kinds, task_prompt, &mut out);
    let report = sub.messages.last().and_then(|m| m["content"].as_str()).unwrap_or_default().to_owned();

    main.messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": report}));
    out.push(main.request(sizes));
    main.messages.push(json!({"role": "assistant", "content": text::prose(&mut rng, sizes.answer_tokens)}));
    let next = user_message(&mut rng, sizes);
    main.user_turn(&mut rng, sizes, &usable, next, &mut out);
    out
}

/// A session that is compacted: a no-tools summary request over its history, then the session
/// continues with the history replaced by the summary.
fn compaction_session(root: &Rng, sizes: &Sizes) -> Vec<BenchRequest> {
    let mut rng = root.fork("compaction");
    let tools = agent::tool_definitions(root, MAIN_TOOLS, sizes.tools_tokens);
    let system = main_system(root, sizes, "project", false);
    let first_user = user_message(&mut rng, sizes);
    let mut out = vec![title_request(root, sizes, 0, &first_user)];
    let mut c = Conversation::new("s0".into(), 0, RequestKind::Agent, system.clone(), tools.clone());
    let usable: Vec<ToolKind> = MAIN_TOOLS.iter().copied().filter(|k| k.name != "task").collect();
    c.user_turn(&mut rng, sizes, &usable, first_user, &mut out);

    let mut history = c.messages.clone();
    history.push(json!({"role": "user", "content": "Summarize the conversation so far for a new session: the task, \
        the files involved, what was done and what is left. Do not call tools."}));
    out.push(Conversation::new("s0/summary".into(), 0, RequestKind::Summary, history, Vec::new()).request(sizes));

    let summary = text::prose(&mut rng, sizes.summary_tokens);
    let mut messages = system;
    messages.push(
        json!({"role": "user", "content": format!("This session continues an earlier one. Summary:\n{summary}")}),
    );
    messages.push(json!({"role": "assistant", "content": "Understood. Continuing from the summary."}));
    let mut after = Conversation::new("s0/continued".into(), 0, RequestKind::Agent, messages, tools);
    let next = user_message(&mut rng, sizes);
    after.user_turn(&mut rng, sizes, &usable, next, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn sizes() -> Sizes {
        Sizes::smollm2()
    }

    #[test]
    fn workloads_are_deterministic_for_a_seed() {
        for name in WORKLOADS {
            let a = serde_json::to_string(&build(name, 42, &sizes()).unwrap()).unwrap();
            let b = serde_json::to_string(&build(name, 42, &sizes()).unwrap()).unwrap();
            let c = serde_json::to_string(&build(name, 43, &sizes()).unwrap()).unwrap();
            assert_eq!(a, b, "{name}");
            assert_ne!(a, c, "{name}: another seed gives another workload");
        }
    }

    /// Within a conversation, each request's messages are the previous request's, then one
    /// assistant reply, then anything else; and the tools never change.
    #[test]
    fn conversations_are_append_only() {
        for name in WORKLOADS {
            let w = build(name, 7, &Sizes::full()).unwrap();
            let mut last: HashMap<&str, &BenchRequest> = HashMap::new();
            for r in &w.requests {
                assert_eq!(r.first, !last.contains_key(r.conversation.as_str()), "{name} {}", r.conversation);
                if let Some(prev) = last.get(r.conversation.as_str()) {
                    assert!(r.messages.len() > prev.messages.len() + 1, "{name} {}", r.conversation);
                    assert_eq!(
                        &r.messages[..prev.messages.len()],
                        &prev.messages[..],
                        "{name}: {} is not append-only",
                        r.conversation
                    );
                    assert_eq!(r.messages[prev.messages.len()]["role"], "assistant", "{name}: the reply comes first");
                    assert_eq!(r.tools, prev.tools);
                }
                last.insert(&r.conversation, r);
            }
        }
    }

    #[test]
    fn shapes_match_the_spec() {
        let w = build("single", 1, &Sizes::full()).unwrap();
        assert_eq!(w.requests[0].kind, RequestKind::Title);
        assert!(w.requests[0].tools.is_empty());
        let agent = &w.requests[1];
        assert_eq!(agent.tools.len(), 10);
        let tools_estimate = text::estimate_tokens(&Json::Array(agent.tools.clone()).to_string());
        assert!((4000..6500).contains(&tools_estimate), "tools ~5k tokens, got {tools_estimate}");
        let system = agent.messages[0]["content"].as_str().unwrap();
        assert!((1800..2600).contains(&text::estimate_tokens(system)), "system ~2.1k tokens");
        // Tool calls have empty content and compact JSON arguments.
        let call = w.requests.last().unwrap().messages.iter().find(|m| m.get("tool_calls").is_some()).unwrap();
        assert_eq!(call["content"], "");
        let args = call["tool_calls"][0]["function"]["arguments"].as_str().unwrap();
        assert!(!args.contains(": ") && serde_json::from_str::<Json>(args).is_ok());

        let split = build("split-system", 1, &Sizes::full()).unwrap();
        let m = &split.requests[1].messages;
        assert_eq!((m[0]["role"].as_str(), m[1]["role"].as_str()), (Some("system"), Some("system")));
        assert!(m[1]["content"].as_str().unwrap().contains("Working directory"));

        let inter = build("interleaved", 1, &Sizes::full()).unwrap();
        let sessions: std::collections::BTreeSet<usize> = inter.requests.iter().map(|r| r.session).collect();
        assert_eq!(sessions.len(), 4);
        let folders: std::collections::BTreeSet<bool> = inter
            .requests
            .iter()
            .filter(|r| r.kind == RequestKind::Agent)
            .map(|r| r.messages[0]["content"].as_str().unwrap().contains("other-project"))
            .collect();
        assert_eq!(folders.len(), 2, "sessions in two folders");
    }

    #[test]
    fn scaled_prompts_stay_under_the_limit() {
        let s = sizes();
        for name in WORKLOADS {
            for r in build(name, 3, &s).unwrap().requests {
                let c = Conversation::new(String::new(), 0, r.kind, r.messages, r.tools);
                assert!(c.estimate() <= s.max_prompt_tokens, "{name}: {}", c.estimate());
            }
        }
    }

    #[test]
    fn branching_workloads_branch_inside_the_system_block() {
        let s = sizes();
        let system = |r: &BenchRequest| r.messages[0]["content"].as_str().unwrap().to_owned();
        let w = build("subagent-branch", 1, &s).unwrap();
        let main = w.requests.iter().find(|r| r.kind == RequestKind::Agent).unwrap();
        let sub = w.requests.iter().find(|r| r.kind == RequestKind::Subagent).unwrap();
        assert_eq!(sub.tools[..], main.tools[..8], "the subagent has the main agent's first tools, the same text");
        assert_eq!(sub.tools.len(), 8);
        let (main_text, sub_text) = (system(main), system(sub));
        let shared = main_text.bytes().zip(sub_text.bytes()).take_while(|(a, b)| a == b).count();
        assert!(shared > main_text.len() / 3 && shared < main_text.len() * 2 / 3, "{shared} of {}", main_text.len());

        let w = build("edited-system", 1, &s).unwrap();
        let texts: std::collections::BTreeMap<usize, String> =
            w.requests.iter().filter(|r| r.kind == RequestKind::Agent).map(|r| (r.session, system(r))).collect();
        let (a, b) = (&texts[&0], &texts[&1]);
        let differing = a.lines().zip(b.lines()).filter(|(x, y)| x != y).count();
        assert_eq!((differing, a.lines().count()), (1, b.lines().count()), "one line differs");
        let shared = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert!(shared > a.len() / 4 && shared < a.len() * 3 / 4, "the edit is in the middle: {shared} of {}", a.len());
        let tools =
            |session| &w.requests.iter().find(|r| r.session == session && r.kind == RequestKind::Agent).unwrap().tools;
        assert_eq!(tools(0), tools(1), "the same tools");
    }
}
