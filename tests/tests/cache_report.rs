//! The per-request cache report: where reuse of the previous version of a conversation stopped
//! and why (changed_content, rerendered_history, new_content, evicted, cache_disabled), plus
//! `/v1/cache`, against the real binary.

mod common;

use common::{Server, chat, filler};
use serde_json::{Value as Json, json};

/// A ChatML template that, like Qwen3's, shows an assistant's reasoning only on the latest
/// assistant turn, so a later request re-renders an earlier turn without it.
const TEMPLATE: &str = r#"{%- set ns = namespace(last=-1) -%}
{%- for m in messages %}{% if m.role == 'assistant' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor -%}
{%- for m in messages -%}
<|im_start|>{{ m.role }}
{% if m.role == 'assistant' and loop.index0 == ns.last and m.reasoning_content %}<think>{{ m.reasoning_content }}</think>
{% endif %}{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"#;

/// The key that may read prompt text in `/v1/cache`.
const ADMIN_KEY: &str = "admin-k";

/// Sends a greedy chat request asking for the cache report; returns the response.
fn ask(server: &Server, messages: Json, max_tokens: usize) -> Json {
    let mut body = chat(messages, max_tokens);
    body["cache_report"] = json!(true);
    let (status, response) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{response}");
    let report = &response["cache_report"];
    assert_eq!(report["cached_tokens"], response["usage"]["prompt_tokens_details"]["cached_tokens"]);
    assert_eq!(report["prompt_tokens"], response["usage"]["prompt_tokens"]);
    response
}

fn sys(stable: &str, dynamic: &str) -> Json {
    json!([{"role": "system", "content": stable}, {"role": "system", "content": dynamic}])
}

fn with(mut base: Json, more: Json) -> Json {
    base.as_array_mut().unwrap().extend(more.as_array().unwrap().iter().cloned());
    base
}

#[test]
fn misses_are_placed_and_explained() {
    let template = std::env::temp_dir().join(format!("radix-cache-report-{}.jinja", std::process::id()));
    std::fs::write(&template, TEMPLATE).unwrap();
    // 8 MiB of KV is a few hundred SmolLM2 tokens: small enough to evict on purpose.
    let server = Server::start(&[
        "--chat-template-file",
        template.to_str().unwrap(),
        "--kv-cache",
        "8",
        "--admin-api-key",
        ADMIN_KEY,
    ]);
    let stable = "You are a careful coding agent. Read files before editing them.";
    let user = json!([{"role": "user", "content": "List the files."}]);

    // One word edited in the second (dynamic) system block: reuse stops there.
    let first = ask(&server, with(sys(stable, "Today is Monday. The cwd is /src."), user.clone()), 3);
    let second = ask(&server, with(sys(stable, "Today is Tuesday. The cwd is /src."), user.clone()), 3);
    assert_eq!(first["cache_report"]["divergence"]["token"], 0, "{first}");
    let report = &second["cache_report"];
    assert_eq!(report["reason"], "changed_content", "{report}");
    assert_eq!(report["divergence"]["part"], "system", "{report}");
    assert_eq!(report["divergence"]["message_index"], 1, "{report}");
    let cached = report["cached_tokens"].as_u64().unwrap();
    assert!(cached > 10, "the stable block and the dynamic block's start are reused: {report}");
    assert_eq!(report["divergence"]["token"], cached, "pages of one token: reuse stops at the divergence");
    assert!(report["divergence"]["after"].as_str().unwrap().contains("Tuesday"), "{report}");
    assert!(report["divergence"]["previous_after"].as_str().unwrap().contains("Monday"), "{report}");

    // The same request again: everything but the last token is reused, nothing to explain.
    let again = ask(&server, with(sys(stable, "Today is Tuesday. The cwd is /src."), user.clone()), 3);
    assert_eq!(again["cache_report"]["reason"], Json::Null, "{again}");
    assert_eq!(again["cache_report"]["divergence"], Json::Null, "{again}");

    // A plain append after the previous prompt: new content.
    let history = json!([
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "Name a prime number."}
    ]);
    let turn1 = ask(&server, history.clone(), 3);
    let turn2_messages = with(
        history.clone(),
        json!([
            {"role": "assistant", "content": "Noted: 42 zebras."},
            {"role": "user", "content": "Another one?"}
        ]),
    );
    let turn2 = ask(&server, turn2_messages, 3);
    let report = &turn2["cache_report"];
    assert_eq!(report["reason"], "new_content", "{report}");
    assert_eq!(report["divergence"]["message_index"], 2, "{report}");
    assert_eq!(report["divergence"]["role"], "assistant", "{report}");
    let turn1_prompt = turn1["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(report["cached_tokens"].as_u64().unwrap() >= turn1_prompt - 1, "{report}");

    // The template drops an earlier turn's reasoning: same messages, different text.
    let reasoning_turn = json!([
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "It is four.", "reasoning_content": "Two and two make four."},
        {"role": "user", "content": "And three plus three?"}
    ]);
    ask(&server, reasoning_turn.clone(), 3);
    let next = with(
        reasoning_turn,
        json!([
            {"role": "assistant", "content": "It is six."},
            {"role": "user", "content": "Thanks."}
        ]),
    );
    let report = ask(&server, next, 3)["cache_report"].clone();
    assert_eq!(report["reason"], "rerendered_history", "{report}");
    assert_eq!(report["divergence"]["part"], "message", "{report}");
    assert_eq!(report["divergence"]["message_index"], 1, "{report}");

    // The cache turned off for one request.
    let mut cold = chat(user.clone(), 2);
    cold["cache_prompt"] = json!(false);
    cold["cache_report"] = json!(true);
    let (_, response) = server.post("/v1/chat/completions", &cold);
    assert_eq!(response["cache_report"]["reason"], "cache_disabled", "{response}");

    // A conversation pushed out of the cache by a long unrelated prompt: evicted.
    let conversation = json!([{"role": "user", "content": format!("Summarise: {}", filler(1, 60))}]);
    let before = ask(&server, conversation.clone(), 2);
    // Size the unrelated prompt from the measured tokens per word so that it and the
    // conversation cannot both stay in the pool.
    let capacity = server.get("/health")["engine"]["pages_total"].as_u64().unwrap() as f64;
    let conversation_tokens = before["usage"]["prompt_tokens"].as_u64().unwrap() as f64;
    let words = ((capacity - 24.0) * 60.0 / conversation_tokens) as usize;
    let long = json!([{"role": "user", "content": format!("Summarise: {}", filler(2, words))}]);
    let long_tokens = ask(&server, long, 2)["usage"]["prompt_tokens"].as_u64().unwrap() as f64;
    assert!(long_tokens + conversation_tokens > capacity, "{long_tokens} + {conversation_tokens} fit in {capacity}");
    let after = with(
        conversation,
        json!([{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Shorter, please."}]),
    );
    let report = ask(&server, after, 2)["cache_report"].clone();
    assert_eq!(report["reason"], "evicted", "{report}");
    let matched = report["previous"]["common_prefix_tokens"].as_u64().unwrap();
    assert!(matched >= before["usage"]["prompt_tokens"].as_u64().unwrap() - 1, "{report}");
    assert!(report["cached_tokens"].as_u64().unwrap() < matched, "{report}");

    // The cache as a whole, and the header on every chat response.
    let cache: Json = ureq::get(&format!("{}/v1/cache", server.base))
        .set("Authorization", &format!("Bearer {ADMIN_KEY}"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert!(cache["evicted_pages"].as_u64().unwrap() > 0, "{cache}");
    assert!(cache["tokens_cached"].as_u64().unwrap() > 0, "{cache}");
    assert!(cache["hit_ratio"].as_f64().unwrap() > 0.0, "{cache}");
    let top = cache["top_prefixes"].as_array().unwrap();
    assert!(!top.is_empty() && top[0]["head"].as_str().unwrap().starts_with("<|im_start|>"), "{cache}");
    let response = ureq::post(&format!("{}/v1/chat/completions", server.base)).send_json(chat(user, 2)).unwrap();
    let header = response.header("x-radix-cache").expect("x-radix-cache header").to_owned();
    let body: Json = response.into_json().unwrap();
    assert!(body.get("cache_report").is_none(), "only on request");
    let usage = &body["usage"];
    let expected =
        format!("cached={} prompt={}", usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]);
    assert!(header.starts_with(&expected), "{header} vs {expected}");

    // Streaming: the report rides on the chunk that carries finish_reason.
    let mut body = chat(json!([{"role": "user", "content": "List the files."}]), 2);
    body["stream"] = json!(true);
    body["cache_report"] = json!(true);
    let chunks: Vec<Json> =
        server.stream(&body).iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    let last = chunks.iter().find(|c| !c["choices"][0]["finish_reason"].is_null()).unwrap();
    assert_eq!(last["cache_report"]["reason"], Json::Null, "a repeat is a full hit: {last}");
    no_client_reads_another_clients_prompt(&server);
    a_cache_salt_keeps_its_prefixes_to_itself(&server);
    salted_prompts_that_differ_only_at_their_start_share_nothing(&server);
    prompt_parts_add_up_and_match_each_parts_own_tokens(&server);
    let _ = std::fs::remove_file(template);
}

/// A victim's request, then requests of another tenant (another `user`, and none at all) that
/// share its system prompt and ask for the cache report: nothing of the victim's message comes
/// back, from the report, `/v1/cache` without the admin key, or the server's log. (It used to
/// come back in `divergence.previous_after`, a few words per request.)
fn no_client_reads_another_clients_prompt(server: &Server) {
    const SECRET: &str = "BLUEHERON";
    // A system prompt no other check sends: the only earlier sequence it starts is the victim's.
    let system = json!({"role": "system", "content": "You review pull requests for a payments team."});
    let victim = json!([system, {"role": "user", "content": format!("Our codename is {SECRET} and it ships in May.")}]);
    let mut body = chat(victim, 2);
    body["user"] = json!("victim");
    let (status, response) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{response}");
    let shared = |tenant: &Json| {
        let mut probe = chat(json!([system, {"role": "user", "content": "O"}]), 1);
        probe["cache_report"] = json!(true);
        probe["user"] = tenant.clone();
        let (status, response) = server.post("/v1/chat/completions", &probe);
        assert_eq!(status, 200, "{response}");
        let report = response["cache_report"].clone();
        assert!(!report.to_string().contains("BLUE"), "tenant {tenant}: {report}");
        report["previous"]["common_prefix_tokens"].as_u64().unwrap_or(0)
    };
    // Other tenants' probes are compared at most with sequences that share the template's
    // opening tokens, never with the victim's, which shares the whole system prompt.
    let others = [shared(&json!("mallory")), shared(&Json::Null)];
    let own = shared(&json!("victim"));
    assert!(others.iter().all(|&n| n < own), "others matched {others:?} tokens, the victim {own}");
    let cache = server.get("/v1/cache");
    assert!(!cache.to_string().contains("BLUE"), "{cache}");
    assert!(cache["top_prefixes"].as_array().unwrap().iter().all(|p| p.get("head").is_none()), "{cache}");
    let log = server.log().join("\n");
    assert!(!log.contains("BLUE") && !log.contains("codename"), "the log quotes prompts:\n{log}");
}

/// Requests with a `cache_salt` reuse only prefixes cached under the same salt (vLLM's
/// isolation): another salt, or none, finds nothing of them, so no client can time another's
/// cached prompt; the same salt hits as usual.
fn a_cache_salt_keeps_its_prefixes_to_itself(server: &Server) {
    let prompt = json!([
        // Short: this server's 8 MiB of KV holds the three namespaces' copies at once.
        {"role": "system", "content": common::filler(9, 50)},
        {"role": "user", "content": "Which files changed?"},
    ]);
    let cached = |salt: Option<&str>| -> u64 {
        let mut body = chat(prompt.clone(), 1);
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        let (status, response) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{response}");
        response["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    };
    assert_eq!(cached(Some("tenant-a")), 0, "a new prompt");
    assert_eq!(cached(Some("tenant-b")), 0, "another salt reads nothing of tenant-a's");
    // Earlier checks' unsalted requests share the template's opening tokens, nothing more.
    let unsalted = cached(None);
    assert!(unsalted < 8, "nor does a request without a salt: {unsalted} cached tokens");
    let hit = cached(Some("tenant-a"));
    assert!(hit >= 48, "the same salt hits: {hit} cached tokens");
    assert!(cached(None) >= 48, "requests without a salt share among themselves");
}

/// Two raw prompts under one salt that differ only in their first words and share a long tail:
/// the second is served nothing of the first's K/V and answers as it does with
/// `cache_prompt: false`. (A key that wrote the salt over the first two tokens served it the
/// whole tail.)
fn salted_prompts_that_differ_only_at_their_start_share_nothing(server: &Server) {
    let tail = common::filler(5, 40);
    let complete = |head: &str, cache_prompt: bool| -> (u64, String) {
        let body = json!({"prompt": format!("{head} {tail}"), "max_tokens": 8, "temperature": 0,
            "cache_salt": "tenant-c", "cache_prompt": cache_prompt});
        let (status, response) = server.post("/v1/completions", &body);
        assert_eq!(status, 200, "{response}");
        let cached = response["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        (cached, response["choices"][0]["text"].as_str().unwrap().to_owned())
    };
    assert_eq!(complete("Alpha beta", true).0, 0, "a new prompt");
    let (cached, warm) = complete("Gamma delta", true);
    assert_eq!(cached, 0, "another prompt's K/V was served");
    assert_eq!(warm, complete("Gamma delta", false).1, "the reply depends on the cache");
}

/// `prompt_parts`: an agent-shaped request (system prompt, tool schemas, a tool call with its
/// reasoning, a tool result) is counted per part; the parts add up to the prompt (and their
/// cached shares to the cached tokens), and each message's tokens, and the tool schemas', are
/// what tokenizing that part's own text gives.
fn prompt_parts_add_up_and_match_each_parts_own_tokens(server: &Server) {
    let body = |cache_report: bool| {
        json!({"temperature": 0, "max_tokens": 1, "cache_report": cache_report,
        "tools": [{"type": "function", "function": {"name": "read", "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}],
        "messages": [
            {"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": "What does a.rs do?"},
            {"role": "assistant", "content": "", "reasoning_content": "I should read the file first.",
             "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "read", "arguments": "{\"path\": \"a.rs\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "fn main() { println!(\"hi\"); }"},
            {"role": "user", "content": "Explain it in one line."}]})
    };
    let (status, response) = server.post("/v1/chat/completions", &body(true));
    assert_eq!(status, 200, "{response}");
    let report = &response["cache_report"];
    let parts = &report["prompt_parts"];
    let kinds =
        ["system", "tools", "user", "assistant", "reasoning", "tool_call_arguments", "tool", "generation_prompt"];
    let sum = |field: &str| kinds.iter().map(|k| parts[k][field].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("tokens"), report["prompt_tokens"].as_u64().unwrap(), "{parts}");
    assert_eq!(sum("cached"), report["cached_tokens"].as_u64().unwrap(), "{parts}");
    assert_eq!(sum("computed"), sum("tokens") - sum("cached"));
    for kind in kinds {
        assert!(parts[kind]["tokens"].as_u64().unwrap() > 0, "{kind} has tokens: {parts}");
    }

    let (status, applied) = server.post("/apply-template", &body(false));
    assert_eq!(status, 200, "{applied}");
    let prompt = applied["prompt"].as_str().unwrap();
    assert_eq!(applied["prompt_tokens"], report["prompt_tokens"]);
    let tokens = |text: &str| {
        let (status, answer) = server.post("/tokenize", &json!({"content": text}));
        assert_eq!(status, 200, "{answer}");
        answer["tokens"].as_array().unwrap().len() as u64
    };
    for message in applied["prompt_parts"]["messages"].as_array().unwrap() {
        let [start, end] = [0, 1].map(|i| message["bytes"][i].as_u64().unwrap() as usize);
        assert_eq!(message["tokens"].as_u64(), Some(tokens(&prompt[start..end])), "{message} in {prompt:?}");
    }
    let (status, without) = server.post("/apply-template", &json!({"messages": body(false)["messages"]}));
    assert_eq!(status, 200, "{without}");
    let without = without["prompt"].as_str().unwrap();
    let at = prompt.bytes().zip(without.bytes()).take_while(|(a, b)| a == b).count();
    let schemas = &prompt[at..at + prompt.len() - without.len()];
    assert_eq!(applied["prompt_parts"]["tools"]["tokens"].as_u64(), Some(tokens(schemas)), "{schemas:?}");
}
