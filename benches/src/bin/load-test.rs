//! `load-test`: a bounded concurrent load test of one running OpenAI-compatible server.
//!
//! ```text
//! load-test --base-url http://127.0.0.1:8080 [--clients 32] [--duration-s 180] [--max-tokens 32]
//!           [--seed 1] [--model smollm2] [--system-prompts 4] [--max-turns 6] [--disconnect-percent 0]
//! ```
//!
//! Every client thread loops over streaming chat requests (`stream: true` with
//! `stream_options.include_usage`): conversations that start from one of a few shared system
//! prompts and grow turn by turn with the replies, so the prefix cache sees sharing across
//! clients, growth within a client, and eviction once all of them together no longer fit. When
//! `--disconnect-percent` of the requests, chosen at random, hang up after a random number of
//! chunks (0 to 8: while queued, during prefill, or while decoding), as clients that are
//! cancelled or crash do; the server must free what they held. When
//! the time is up, in-flight requests finish, the server must drain (`/health`: nothing running
//! or waiting), and then every KV page must be free or held by the cache. Exits non-zero on any
//! failed request or a leaked page; prints a Markdown table.

use radix_benches::cache_bench::text::Rng;
use std::io::{BufRead, BufReader};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value as Json, json};

#[derive(Parser, Clone)]
#[command(about = "Concurrent streaming chat clients against one server; checks that no KV page leaks")]
struct Cli {
    /// The server's root URL (without `/v1`).
    #[arg(long)]
    base_url: String,
    /// Concurrent client threads.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// How long clients start new requests, in seconds.
    #[arg(long, default_value_t = 180)]
    duration_s: u64,
    /// `max_tokens` of every request.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Seed of the conversations and the sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The `model` field of requests.
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Distinct system prompts the clients share.
    #[arg(long, default_value_t = 4)]
    system_prompts: usize,
    /// Most user turns of one conversation before the client starts a new one.
    #[arg(long, default_value_t = 6)]
    max_turns: usize,
    /// Percent of requests that hang up after a random number (0-8) of stream chunks.
    #[arg(long, default_value_t = 0)]
    disconnect_percent: usize,
}

const WORDS: &[&str] = &[
    "the", "agent", "reads", "files", "before", "editing", "tests", "must", "pass", "after", "every", "change", "keep",
    "diffs", "small", "and", "explain", "why", "cache", "prefix", "tokens", "server", "local", "model", "request",
    "stream", "page", "tree", "evict", "share", "queue", "latency",
];

fn prose(rng: &mut Rng, words: usize) -> String {
    let mut out = String::new();
    for i in 0..words {
        out.push_str(WORDS[rng.range(0, WORDS.len() - 1)]);
        out.push(if i % 12 == 11 { '.' } else { ' ' });
    }
    out
}

/// What one request measured.
struct Sample {
    ttft: Duration,
    latency: Duration,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
}

/// Everything the clients recorded.
#[derive(Default)]
struct Totals {
    samples: Vec<Sample>,
    /// Requests the client hung up on, by design.
    disconnected: usize,
    failed: usize,
    errors: Vec<String>,
}

/// One streamed chat request, read to `[DONE]`; returns the measurements and the reply text.
/// With `hang_up_after`, the connection is dropped after that many chunks instead (`None`).
fn stream_chat(
    agent: &ureq::Agent,
    url: &str,
    body: &Json,
    hang_up_after: Option<usize>,
) -> Result<Option<(Sample, String)>> {
    let start = Instant::now();
    let response = match agent.post(url).send_json(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(code, r)) => bail!("HTTP {code}: {}", r.into_string().unwrap_or_default()),
        Err(e) => bail!("no answer: {e}"),
    };
    let (mut ttft, mut reply, mut usage, mut done) = (None, String::new(), None, false);
    let mut chunks = 0;
    for line in BufReader::new(response.into_reader()).lines() {
        if hang_up_after.is_some_and(|n| chunks >= n) {
            return Ok(None);
        }
        let line = line.context("reading the stream")?;
        let Some(data) = line.strip_prefix("data: ") else { continue };
        chunks += 1;
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Json = serde_json::from_str(data).with_context(|| format!("a chunk is not JSON: {data}"))?;
        if chunk.get("error").is_some() {
            bail!("error in the stream: {chunk}");
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        let Some(choice) = chunk["choices"].get(0) else { continue };
        let delta = &choice["delta"];
        let text = delta["content"].as_str().unwrap_or_default();
        let first_output =
            !text.is_empty() || delta.get("reasoning_content").is_some() || delta.get("tool_calls").is_some();
        // The role chunk comes before any token: the first token is the first output, or the
        // end of a reply that had none.
        if ttft.is_none() && (first_output || !choice["finish_reason"].is_null()) {
            ttft = Some(start.elapsed());
        }
        reply.push_str(text);
    }
    if !done {
        bail!("the stream ended without [DONE]");
    }
    let usage = usage.context("no usage chunk although stream_options.include_usage was set")?;
    let count = |v: &Json| v.as_u64().with_context(|| format!("usage is missing a count: {usage}"));
    let sample = Sample {
        ttft: ttft.context("no token and no finish_reason in the stream")?,
        latency: start.elapsed(),
        prompt_tokens: count(&usage["prompt_tokens"])?,
        cached_tokens: count(&usage["prompt_tokens_details"]["cached_tokens"])?,
        completion_tokens: count(&usage["completion_tokens"])?,
    };
    Ok(Some((sample, reply)))
}

/// One client: conversations from a shared system prompt, growing by a turn per request.
fn client(cli: &Cli, id: usize, systems: &[String], deadline: Instant, totals: &Mutex<Totals>) {
    let mut rng = Rng::new(cli.seed.wrapping_mul(1_000_003).wrapping_add(id as u64));
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(600)).build();
    let url = format!("{}/v1/chat/completions", cli.base_url.trim_end_matches('/'));
    let mut messages = Vec::new();
    let mut turns = 0;
    while Instant::now() < deadline {
        if turns == 0 {
            let system = &systems[(id + rng.range(0, 1)) % systems.len()];
            messages = vec![json!({"role": "system", "content": system})];
        }
        let words = 10 + rng.range(0, 39);
        let question = format!("Client {id}, turn {turns}: {} What next?", prose(&mut rng, words));
        messages.push(json!({"role": "user", "content": question}));
        let body = json!({
            "model": cli.model, "messages": messages, "max_tokens": cli.max_tokens, "stream": true,
            "stream_options": {"include_usage": true}, "temperature": 0.8, "seed": rng.next_u64() >> 33,
        });
        let hang_up = (rng.range(0, 99) < cli.disconnect_percent).then(|| rng.range(0, 8));
        let outcome = stream_chat(&agent, &url, &body, hang_up);
        let mut totals = totals.lock().expect("no client panics holding the lock");
        match outcome {
            Ok(None) => {
                totals.disconnected += 1;
                messages.pop();
            }
            Ok(Some((sample, reply))) => {
                totals.samples.push(sample);
                messages.push(json!({"role": "assistant", "content": reply}));
                turns = (turns + 1) % cli.max_turns.max(1);
            }
            Err(e) => {
                totals.failed += 1;
                if totals.errors.len() < 5 {
                    totals.errors.push(format!("client {id}: {e:#}"));
                }
                messages.pop();
                turns = 0;
                drop(totals);
                // A server that refuses everything must not be hammered in a tight loop.
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

fn health(base: &str) -> Result<Json> {
    let url = format!("{}/health", base.trim_end_matches('/'));
    let body: Json = ureq::get(&url).timeout(Duration::from_secs(30)).call()?.into_json()?;
    body.get("engine").cloned().with_context(|| format!("/health has no engine object: {body}"))
}

/// A counter of the server's Prometheus `/metrics` (radix-serve's own names), if it has one.
fn counter(base: &str, name: &str) -> Option<f64> {
    let url = format!("{}/metrics", base.trim_end_matches('/'));
    let text = ureq::get(&url).timeout(Duration::from_secs(30)).call().ok()?.into_string().ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

const EVICTED: &str = "radix_serve_cache_evicted_pages_total";

/// Waits until nothing runs or waits, then returns the engine counts.
fn drained(base: &str) -> Result<Json> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let engine = health(base)?;
        if engine["running"] == 0 && engine["waiting"] == 0 {
            return Ok(engine);
        }
        if Instant::now() > deadline {
            bail!("the server did not drain within 5 minutes: {engine}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let before = health(&cli.base_url).context("the server does not answer /health")?;
    eprintln!("before: {before}");
    let evicted_before = counter(&cli.base_url, EVICTED);
    let mut rng = Rng::new(cli.seed);
    let systems: Vec<String> = (0..cli.system_prompts.max(1))
        .map(|i| format!("You are coding assistant number {i}. House rules: {}", prose(&mut rng, 300 + 100 * i)))
        .collect();
    let totals = Arc::new(Mutex::new(Totals::default()));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(cli.duration_s);
    std::thread::scope(|scope| {
        for id in 0..cli.clients {
            let (cli, systems, totals) = (&cli, &systems, &totals);
            scope.spawn(move || client(cli, id, systems, deadline, totals));
        }
    });
    let wall = start.elapsed();
    let engine = drained(&cli.base_url)?;
    let count = |name: &str| engine[name].as_u64().with_context(|| format!("/health engine.{name}: {engine}"));
    let (total, free, cached) = (count("pages_total")?, count("pages_free")?, count("pages_cached")?);
    let leaked = total as i64 - (free + cached) as i64;
    let evicted = match (evicted_before, counter(&cli.base_url, EVICTED)) {
        (Some(a), Some(b)) => format!("{}", b - a),
        _ => "n/a".to_owned(),
    };

    let totals = totals.lock().expect("clients are done");
    let mut ttft: Vec<Duration> = totals.samples.iter().map(|s| s.ttft).collect();
    let mut latency: Vec<Duration> = totals.samples.iter().map(|s| s.latency).collect();
    ttft.sort();
    latency.sort();
    let sum = |f: fn(&Sample) -> u64| totals.samples.iter().map(f).sum::<u64>();
    let (prompt, cached_tokens, generated) =
        (sum(|s| s.prompt_tokens), sum(|s| s.cached_tokens), sum(|s| s.completion_tokens));
    let rows = [
        ("clients", cli.clients.to_string()),
        ("duration (s, until the last request ended)", format!("{:.1}", wall.as_secs_f64())),
        ("max_tokens", cli.max_tokens.to_string()),
        ("requests ok", totals.samples.len().to_string()),
        ("requests the client hung up on", totals.disconnected.to_string()),
        ("requests failed", totals.failed.to_string()),
        (
            "TTFT p50 / p95 / max (ms)",
            format!(
                "{} / {} / {}",
                ms(percentile(&ttft, 50.0)),
                ms(percentile(&ttft, 95.0)),
                ms(ttft.last().copied().unwrap_or_default())
            ),
        ),
        ("latency p50 / p95 (ms)", format!("{} / {}", ms(percentile(&latency, 50.0)), ms(percentile(&latency, 95.0)))),
        ("generated tokens", generated.to_string()),
        ("generated tokens/s (all clients)", format!("{:.1}", generated as f64 / wall.as_secs_f64())),
        ("prompt tokens (cached)", format!("{prompt} ({cached_tokens})")),
        ("cached token ratio", format!("{:.3}", if prompt > 0 { cached_tokens as f64 / prompt as f64 } else { 0.0 })),
        ("pages total / free / cached after drain", format!("{total} / {free} / {cached}")),
        ("pages evicted from the cache during the run", evicted),
        ("pages leaked", leaked.to_string()),
    ];
    println!("| metric | value |\n|---|---|");
    for (name, value) in rows {
        println!("| {name} | {value} |");
    }
    for e in &totals.errors {
        eprintln!("error: {e}");
    }
    if totals.failed > 0 || leaked != 0 {
        bail!("{} failed requests, {leaked} leaked pages", totals.failed);
    }
    Ok(())
}
