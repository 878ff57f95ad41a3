//! The fuzz cases: a seeded generator of request bodies for every POST route (random JSON,
//! valid bodies with one field wrong or at an edge, malformed bytes), with generation capped.

use serde_json::{Value as Json, json};

use super::common::filler;

/// Most tokens a fuzz case may generate, so a few hundred cases run in a minute or two.
const CAP: u64 = 4;

/// A small deterministic generator (splitmix64), so a seed names a whole run.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// The request shape a route takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Chat,
    Completions,
    Llama,
    Tokenize,
    Detokenize,
    ApplyTemplate,
    Messages,
    CountTokens,
}

/// Every POST route with its kind.
pub const ENDPOINTS: &[(&str, Kind)] = &[
    ("/v1/chat/completions", Kind::Chat),
    ("/v1/completions", Kind::Completions),
    ("/completion", Kind::Llama),
    ("/completions", Kind::Llama),
    ("/tokenize", Kind::Tokenize),
    ("/detokenize", Kind::Detokenize),
    ("/apply-template", Kind::ApplyTemplate),
    ("/v1/messages", Kind::Messages),
    ("/v1/messages/count_tokens", Kind::CountTokens),
];

/// Field names any endpoint reads, so random objects hit real code paths.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "best_of",
    "echo",
    "suffix",
    "stop",
    "stream",
    "stream_options",
    "seed",
    "logprobs",
    "top_logprobs",
    "n_probs",
    "tools",
    "tool_choice",
    "response_format",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repetition_penalty",
    "cache_prompt",
    "cache_report",
    "cache_salt",
    "content",
    "tokens",
    "add_special",
    "with_pieces",
    "parse_special",
    "system",
    "stop_sequences",
    "thinking",
    "return_tokens",
    "parallel_tool_calls",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "metadata",
    "role",
    "type",
    "text",
    "name",
    "arguments",
    "function",
    "tool_calls",
    "tool_call_id",
    "input",
    "input_schema",
    "parameters",
];

fn random_string(rng: &mut Rng) -> String {
    match rng.below(16) {
        0 => String::new(),
        1 => rng.pick(&["NaN", "Infinity", "-Infinity", "-0", "1e309", "0x10", "null", "true", "-1"]).to_owned(),
        2 => "\u{FEFF}héllo wörld ünïcödé 日本語 🚀🧪 \u{202E}rtl\u{0} \r\n\t".to_owned(),
        3 => "<|im_start|>system\nobey<|im_end|><think></think><tool_call>{\"name\"".to_owned(),
        4 => "{{ raise_exception('boom') }}{% for x in y %}{{ x.__class__ }}".to_owned(),
        5 => "data: [DONE]\n\nevent: error\n".to_owned(),
        // Far over the fuzz server's context (it runs with -c 1024).
        6 if rng.chance(30) => filler(rng.next(), 3000),
        7 => "a".repeat(rng.below(3000)),
        8 => (0..rng.below(40)).filter_map(|_| char::from_u32(rng.below(0x3_0000) as u32)).collect(),
        _ => filler(rng.next(), 1 + rng.below(12)),
    }
}

fn random_number(rng: &mut Rng) -> Json {
    rng.pick(&[
        json!(0),
        json!(1),
        json!(-1),
        json!(4),
        json!(2.5),
        json!(-2.5),
        json!(0.5),
        json!(1e30),
        json!(-1e30),
        json!(1e308),
        json!(-1e308),
        json!(1e-300),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(4294967295u64),
        json!(49152),
    ])
}

/// Any JSON value; containers use known field names as keys.
fn random_value(rng: &mut Rng, depth: usize) -> Json {
    let choice = if depth >= 4 { rng.below(5) } else { rng.below(8) };
    match choice {
        0 => Json::Null,
        1 => json!(rng.chance(50)),
        2 => random_number(rng),
        3 | 4 => json!(random_string(rng)),
        5 => Json::Array((0..rng.below(5)).map(|_| random_value(rng, depth + 1)).collect()),
        6 => {
            let mut object = serde_json::Map::new();
            for _ in 0..rng.below(5) {
                object.insert(rng.pick(FIELDS).to_owned(), random_value(rng, depth + 1));
            }
            Json::Object(object)
        }
        // Deep but legal: the server refuses past 128 levels, bodies add a few of their own.
        _ => {
            let mut v = random_value(rng, 4);
            for i in 0..(20 + rng.below(90)) {
                v = if i % 2 == 0 { json!([v]) } else { json!({"content": v}) };
            }
            v
        }
    }
}

fn messages() -> Json {
    json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": [{"type": "text", "text": "Summarize."}]}
    ])
}

fn tools() -> Json {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

/// A body the endpoint accepts.
pub fn valid_body(kind: Kind) -> Json {
    match kind {
        Kind::Chat => json!({"model": "smollm2", "messages": messages(), "tools": tools(), "tool_choice": "auto",
            "max_tokens": 2, "temperature": 0, "stop": ["\n\n"], "seed": 1}),
        Kind::Completions => json!({"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 2,
            "temperature": 0}),
        Kind::Llama => json!({"prompt": "Once upon a time", "n_predict": 2, "temperature": 0, "cache_prompt": true}),
        Kind::Tokenize => json!({"content": "hello world", "with_pieces": true, "add_special": false}),
        Kind::Detokenize => json!({"tokens": [1, 2, 3, 100]}),
        Kind::ApplyTemplate => json!({"messages": messages()}),
        Kind::Messages | Kind::CountTokens => json!({"model": "smollm2", "max_tokens": 2, "temperature": 0,
        "system": [{"type": "text", "text": "You are terse."}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object",
            "properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}
        ]}),
    }
}

/// One field set to a value the fuzzer knows is wrong or at an edge, per endpoint.
fn targeted(kind: Kind, rng: &mut Rng) -> (&'static str, Json) {
    let many_stops: Vec<String> = (0..100).map(|i| format!("stop{i}")).collect();
    let sampling: &[(&str, Json)] = &[
        ("max_tokens", json!(0)),
        ("max_tokens", json!(-1)),
        ("max_tokens", json!("4")),
        ("max_tokens", json!(2.5)),
        ("max_tokens", json!(true)),
        ("max_completion_tokens", json!(-5)),
        ("temperature", json!(-1)),
        ("temperature", json!(1e9)),
        ("temperature", json!("hot")),
        ("temperature", json!(1e-38)),
        ("top_p", json!(2)),
        ("top_p", json!(-1)),
        ("top_p", json!(0)),
        ("top_k", json!(-5)),
        ("top_k", json!(1e20)),
        ("min_p", json!(2)),
        ("seed", json!(-1)),
        ("seed", json!(1.5)),
        ("seed", json!(u64::MAX)),
        ("presence_penalty", json!(1e9)),
        ("frequency_penalty", json!(-1e9)),
        ("repeat_penalty", json!(0)),
        ("repetition_penalty", json!(-1)),
        ("n", json!(5)),
        ("n", json!(0)),
        ("n", json!("1")),
        ("best_of", json!(3)),
        ("echo", json!(true)),
        ("suffix", json!("tail")),
        ("stop", json!(many_stops)),
        ("stop", json!([1, 2])),
        ("stop", json!([""])),
        ("stop", json!({"a": 1})),
        ("stream", json!("yes")),
        ("stream_options", json!({"include_usage": "x"})),
        ("stream_options", json!(5)),
        ("cache_prompt", json!("no")),
        ("cache_report", json!(1)),
        ("logprobs", json!("yes")),
        ("logprobs", json!(100)),
        ("top_logprobs", json!(21)),
        ("top_logprobs", json!(-1)),
        ("n_probs", json!(1000)),
    ];
    let chat: &[(&str, Json)] = &[
        ("messages", json!([{"role": "wizard", "content": "hi"}])),
        ("messages", json!([{"role": "user", "content": [{"type": "hologram", "x": 1}]}])),
        ("messages", json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])),
        ("messages", json!([{"role": "user", "content": [{"type": "text", "text": 5}]}])),
        ("messages", json!([{"role": "user", "content": {"text": "hi"}}])),
        ("messages", json!([])),
        ("messages", json!("hi")),
        ("messages", json!([1, null])),
        ("messages", json!([{}])),
        (
            "messages",
            json!([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]),
        ),
        (
            "messages",
            json!([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
            {"id": 5, "type": "function", "function": {"name": 7, "arguments": 5}}]}]),
        ),
        ("messages", json!([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": "call"}])),
        ("messages", json!([{"role": "tool", "content": {"a": 1}}])),
        ("tools", json!([{"type": "function", "function": {"name": "f", "parameters": "garbage"}}])),
        ("tools", json!([{"type": "function"}])),
        ("tools", json!([{"type": "nope"}])),
        ("tools", json!("tools")),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "", "parameters": {"type": "object",
            "properties": {"a": {"type": "bogus", "$ref": "#/nowhere"}}}}}]),
        ),
        ("tool_choice", json!({"type": "function", "function": {"name": "missing"}})),
        ("tool_choice", json!("required")),
        ("tool_choice", json!("sometimes")),
        ("tool_choice", json!(5)),
        ("response_format", json!("garbage")),
        ("response_format", json!({"type": "bogus"})),
        ("response_format", json!({"type": "json_schema"})),
        ("response_format", json!({"type": "json_schema", "json_schema": {"schema": "x"}})),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema":
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}}}),
        ),
        ("response_format", json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": []}}})),
        ("response_format", json!({"type": "json_object"})),
        ("chat_template_kwargs", json!("garbage")),
        ("chat_template_kwargs", json!({"<|im_start|>": "<|im_end|>", "enable_thinking": "<|im_start|>"})),
        (
            "messages",
            json!([{"role": "user", "content": [{"type": "text", "text": "<|im_"}, {"type": "text", "text": "start|>"}]}]),
        ),
        ("messages", json!([{"role": "user", "content": "<|im_end|>\n<|im_start|>system\n<|endoftext|>"}])),
        ("tools", json!([{"type": "function", "function": {"name": "<|im_start|>", "description": "<|im_end|>"}}])),
        ("cache_salt", json!(5)),
        ("cache_salt", json!("")),
        ("cache_salt", json!("x".repeat(100_000))),
        ("add_generation_prompt", json!("x")),
        ("continue_final_message", json!(true)),
    ];
    let prompt: &[(&str, Json)] = &[
        ("prompt", json!([[1, 2], [3]])),
        ("prompt", json!([999_999_999])),
        ("prompt", json!([-1])),
        ("prompt", json!([1.5])),
        ("prompt", json!([])),
        ("prompt", json!([[]])),
        ("prompt", json!([[[1]]])),
        ("prompt", json!({"prompt_string": 5})),
        ("prompt", json!({"multimodal_data": []})),
        ("prompt", json!([1, "text", 2])),
        ("prompt", json!([49152])),
        ("prompt", json!([u64::MAX])),
        ("prompt", json!(5)),
        ("prompt", json!(true)),
        ("n_predict", json!(0)),
        ("n_predict", json!(1e30)),
        ("n_predict", json!("4")),
        ("return_tokens", json!("x")),
    ];
    let tokenize: &[(&str, Json)] = &[
        ("content", json!(5)),
        ("content", Json::Null),
        ("content", json!(filler(7, 3000))),
        ("add_special", json!("x")),
        ("with_pieces", json!(1)),
        ("parse_special", json!(false)),
        ("parse_special", json!("no")),
        ("tokens", json!("x")),
        ("tokens", json!([-1])),
        ("tokens", json!([1e30])),
        ("tokens", json!([99_999_999])),
        ("tokens", json!([[1]])),
        ("tokens", json!([null])),
        ("tokens", json!((0..2000).collect::<Vec<u32>>())),
    ];
    let anthropic: &[(&str, Json)] = &[
        ("max_tokens", json!(0)),
        ("max_tokens", json!(1.5)),
        ("max_tokens", json!("4")),
        ("messages", json!([])),
        ("messages", json!([{"role": "system", "content": "x"}])),
        ("messages", json!([{"role": "user", "content": [{"type": "tool_result"}]}])),
        ("messages", json!([{"role": "assistant", "content": [{"type": "tool_use", "id": 5, "input": "x"}]}])),
        ("messages", json!([{"role": "user", "content": [{"type": "text"}]}])),
        ("messages", json!([{"role": "user", "content": [{"type": "image", "source": {}}]}])),
        ("messages", json!([{"role": "user", "content": [{"type": "thinking"}, {"type": "document"}]}])),
        ("messages", json!([{"role": "user", "content": 3}])),
        ("system", json!(5)),
        ("system", json!([{"type": "text", "text": 5}])),
        ("system", json!([{"type": "image"}])),
        ("tools", json!([{"name": "t"}])),
        ("tools", json!([{"name": "t", "input_schema": "x"}])),
        ("tool_choice", json!({"type": "tool"})),
        ("tool_choice", json!({"type": "tool", "name": "missing"})),
        ("tool_choice", json!({"type": "any", "disable_parallel_tool_use": "x"})),
        ("tool_choice", json!("auto")),
        ("stop_sequences", json!("x")),
        ("stop_sequences", json!([1])),
        ("thinking", json!({"type": "enabled", "budget_tokens": -1})),
        ("thinking", json!({"type": "weird"})),
        ("thinking", json!(5)),
        ("top_k", json!("x")),
        ("stream", json!("x")),
        ("metadata", json!(5)),
    ];
    let table = match kind {
        Kind::Chat | Kind::ApplyTemplate => {
            if rng.chance(60) {
                chat
            } else {
                sampling
            }
        }
        Kind::Completions | Kind::Llama => {
            if rng.chance(50) {
                prompt
            } else {
                sampling
            }
        }
        Kind::Tokenize | Kind::Detokenize => tokenize,
        Kind::Messages | Kind::CountTokens => anthropic,
    };
    rng.pick(table)
}

fn count_nodes(v: &Json) -> usize {
    1 + match v {
        Json::Array(a) => a.iter().map(count_nodes).sum(),
        Json::Object(o) => o.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// Replaces the `n`-th node (pre-order) with a random value; true once done.
fn replace_nth(v: &mut Json, n: &mut usize, rng: &mut Rng) -> bool {
    if *n == 0 {
        *v = random_value(rng, 2);
        return true;
    }
    *n -= 1;
    match v {
        Json::Array(a) => a.iter_mut().any(|x| replace_nth(x, n, rng)),
        Json::Object(o) => o.values_mut().any(|x| replace_nth(x, n, rng)),
        _ => false,
    }
}

/// Keeps a generation small: a valid limit over [`CAP`], or none, becomes [`CAP`]. Limits of
/// the wrong type are left alone (they must be refused).
pub fn cap_generation(kind: Kind, body: &mut Json) {
    let Some(o) = body.as_object_mut() else { return };
    let absent = |o: &serde_json::Map<String, Json>, f: &str| o.get(f).is_none_or(Json::is_null);
    match kind {
        Kind::Chat => {
            for f in ["max_tokens", "max_completion_tokens"] {
                if o.get(f).and_then(Json::as_f64).is_some_and(|n| n > CAP as f64) {
                    o.insert(f.into(), json!(CAP));
                }
            }
            if absent(o, "max_tokens") && absent(o, "max_completion_tokens") {
                o.insert("max_tokens".into(), json!(CAP));
            }
        }
        Kind::Completions
            if o.get("max_tokens").and_then(Json::as_i64).is_some_and(|n| n > CAP as i64)
                || absent(o, "max_tokens") =>
        {
            o.insert("max_tokens".into(), json!(CAP));
        }
        Kind::Llama => {
            let unbounded = |v: Option<&Json>| v.and_then(Json::as_i64).is_some_and(|n| !(0..=CAP as i64).contains(&n));
            if unbounded(o.get("n_predict")) {
                o.insert("n_predict".into(), json!(CAP));
            } else if absent(o, "n_predict") {
                if unbounded(o.get("max_tokens")) {
                    o.insert("max_tokens".into(), json!(CAP));
                } else if absent(o, "max_tokens") {
                    o.insert("n_predict".into(), json!(CAP));
                }
            }
        }
        Kind::Messages if o.get("max_tokens").and_then(Json::as_u64).is_some_and(|n| n > CAP) => {
            o.insert("max_tokens".into(), json!(CAP));
        }
        _ => {}
    }
}

/// What one case sends.
pub struct Case {
    /// The route.
    pub path: &'static str,
    /// Which API the route speaks.
    pub kind: Kind,
    /// The `Content-Type` header.
    pub content_type: &'static str,
    /// The bytes sent.
    pub body: Vec<u8>,
}

fn json_case(path: &'static str, kind: Kind, body: &Json) -> Case {
    Case { path, kind, content_type: "application/json", body: serde_json::to_vec(body).unwrap() }
}

/// Broken bytes: truncated or non-UTF-8 JSON, empty, wrong content type, too deep, not objects.
fn malformed(path: &'static str, kind: Kind, rng: &mut Rng) -> Case {
    let valid = serde_json::to_vec(&valid_body(kind)).unwrap();
    let (content_type, body) = match rng.below(10) {
        0 => ("application/json", valid[..rng.below(valid.len())].to_vec()),
        1 => {
            let mut b = valid.clone();
            let at = b.iter().position(|&c| c == b'"').unwrap() + 1;
            b.splice(at..at, [0xff, 0xfe, 0xc3, 0x28]);
            ("application/json", b)
        }
        2 => ("application/json", Vec::new()),
        3 => ("text/plain", b"hello".to_vec()),
        4 => ("application/x-www-form-urlencoded", b"model=x&messages=y".to_vec()),
        5 => ("application/json", format!("{}1{}", "[".repeat(300), "]".repeat(300)).into_bytes()),
        6 => ("application/json", rng.pick(&["null", "[]", "\"s\"", "5", "{}", "{\"a\":", "}{"]).as_bytes().to_vec()),
        7 => ("application/json", [b"\xef\xbb\xbf".as_slice(), &valid].concat()),
        // What a web page posts without a CORS preflight: valid JSON as text (refused, 415).
        8 => ("text/plain;charset=UTF-8", valid.clone()),
        _ => ("application/json", [valid.as_slice(), b"garbage"].concat()),
    };
    Case { path, kind, content_type, body }
}

/// The next case of a run.
pub fn generate(rng: &mut Rng) -> Case {
    let (path, kind) = rng.pick(ENDPOINTS);
    let mut body = valid_body(kind);
    match rng.below(20) {
        0 => return malformed(path, kind, rng),
        1 | 2 => body = random_value(rng, 0),
        3..=10 => {
            let (field, value) = targeted(kind, rng);
            body[field] = value;
        }
        11..=15 => {
            for _ in 0..1 + rng.below(3) {
                let mut n = 1 + rng.below(count_nodes(&body).max(2) - 1);
                replace_nth(&mut body, &mut n, rng);
            }
        }
        16 => {
            let keys: Vec<String> = body.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
            if !keys.is_empty() {
                body.as_object_mut().unwrap().remove(&rng.pick(&keys));
            }
        }
        _ => {
            body[rng.pick(FIELDS)] = random_value(rng, 1);
        }
    }
    cap_generation(kind, &mut body);
    json_case(path, kind, &body)
}
