//! The disk tier end to end (`--cache-dir`, `--cache-disk`): an agent-shaped session survives
//! a restart after SIGTERM and after SIGKILL; damaged page files are recomputed with the same
//! answer; the budget holds; another model file in the same directory reuses nothing, and
//! another build of the server reuses nothing and removes what its predecessor left.
//! A hybrid (Qwen3.5) session resumes from its snapshots on disk. SmolLM2-135M, except the last
//! two tests (the tiny qwen3 and qwen35 fixtures); about a minute in all on two
//! cores.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Server, asset, binary, chat, filler, workspace_root};
use serde_json::{Value as Json, json};

/// A directory of its own for one test, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("radix-e2e-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every page file under `dir` (any model's).
fn page_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for model in std::fs::read_dir(dir).into_iter().flatten() {
        for file in std::fs::read_dir(model.unwrap().path()).into_iter().flatten() {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|e| e == "kv") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn post_chat(server: &Server, messages: &Json) -> Json {
    let mut body = chat(messages.clone(), 16);
    body["cache_report"] = json!(true);
    let (status, reply) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    reply
}

fn cached(reply: &Json) -> u64 {
    reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

fn prompt_tokens(reply: &Json) -> u64 {
    reply["usage"]["prompt_tokens"].as_u64().unwrap()
}

fn content(reply: &Json) -> Json {
    reply["choices"][0]["message"]["content"].clone()
}

/// A coding agent's conversation: a long system prompt, then three user turns, each sent with
/// the replies before it. Returns the messages of the last turn with its reply, and that turn's
/// prompt tokens.
fn three_turns(server: &Server) -> (Json, u64) {
    let system = format!("You are a coding agent working in a repository.\n{}", filler(20, 450));
    let mut messages = json!([{"role": "system", "content": system}]);
    let mut last_prompt = 0;
    for turn in 0..3 {
        let user = format!("Step {turn}: {}", filler(30 + turn, 40));
        messages.as_array_mut().unwrap().push(json!({"role": "user", "content": user}));
        let reply = post_chat(server, &messages);
        last_prompt = prompt_tokens(&reply);
        if turn > 0 {
            assert!(cached(&reply) * 10 >= last_prompt * 9, "turn {turn} reuses the session: {reply}");
        }
        messages.as_array_mut().unwrap().push(json!({"role": "assistant", "content": content(&reply)}));
    }
    assert!(last_prompt > 500, "an agent-sized prompt: {last_prompt} tokens");
    (messages, last_prompt)
}

/// The turn after [`three_turns`].
fn fourth_turn(mut messages: Json) -> Json {
    messages.as_array_mut().unwrap().push(json!({"role": "user", "content": "Now run the tests."}));
    messages
}

/// Polls until the engine is idle and the disk tier has written everything queued.
fn wait_written(server: &Server) -> Json {
    server.wait_idle();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let disk = server.get("/v1/cache")["disk"].clone();
        if disk["pending_writes"] == 0 {
            return disk;
        }
        assert!(Instant::now() < deadline, "the disk tier never finished writing: {disk}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metric(server: &Server, name: &str) -> f64 {
    let text = server.get_text("/metrics");
    let line = text.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("{name} in /metrics"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// After a restart the next turn finds the previous prompt on disk, and answers as a cold
/// prefill does.
fn check_restored(restarted: &Server, messages: &Json, previous_prompt: u64) -> Json {
    let next = post_chat(restarted, &fourth_turn(messages.clone()));
    assert!(
        cached(&next) * 100 >= previous_prompt * 99,
        "{} of the previous {previous_prompt} cached: {next}",
        cached(&next)
    );
    let restored = next["cache_report"]["restored_from_disk"].as_u64().unwrap_or(0);
    assert!(restored * 100 >= previous_prompt * 99, "the cache report names the tokens read back: {next}");
    assert!(metric(restarted, "radix_serve_disk_restored_tokens_total") >= restored as f64);
    assert_eq!(metric(restarted, "radix_serve_disk_damaged_files_total"), 0.0);
    assert!(metric(restarted, "radix_serve_disk_read_seconds_count") >= 1.0);
    next
}

#[test]
fn a_session_survives_a_sigterm_restart_and_answers_like_a_cold_prefill() {
    let dir = TempDir::new("sigterm");
    let flags = ["--cache-dir", dir.arg()];
    let mut server = Server::start(&flags);
    let (messages, previous) = three_turns(&server);
    let status = server.stop_with("TERM");
    assert!(status.success(), "a graceful stop exits 0: {status}");
    assert!(server.log().iter().any(|l| l.contains("radix-serve: stopped")), "{:?}", server.log());
    drop(server);
    let restarted = Server::start(&flags);
    assert!(
        restarted.log().iter().any(|l| l.contains("disk cache") && l.contains("tokens in")),
        "start-up says what the disk holds: {:?}",
        restarted.log()
    );
    let next = check_restored(&restarted, &messages, previous);
    let cache = restarted.get("/v1/cache");
    assert!(cache["disk"]["enabled"] == true && cache["disk"]["restores"].as_u64() >= Some(1), "{cache}");
    drop(restarted);
    let cold = Server::start(&["--no-prefix-cache"]);
    let reference = post_chat(&cold, &fourth_turn(messages));
    assert_eq!(cached(&reference), 0);
    assert_eq!(content(&next), content(&reference), "the restored prefix gives the cold answer");
}

#[test]
fn a_session_survives_a_sigkill_once_its_pages_are_written() {
    let dir = TempDir::new("sigkill");
    let flags = ["--cache-dir", dir.arg()];
    let mut server = Server::start(&flags);
    let (messages, previous) = three_turns(&server);
    let disk = wait_written(&server);
    assert!(disk["files_written"].as_u64().unwrap() >= 1, "{disk}");
    // Killed while a new prompt's pages are being written: a half-written file must not count.
    let long = fourth_turn(messages.clone());
    let mut interrupted = long.clone();
    interrupted.as_array_mut().unwrap().push(json!({"role": "user", "content": filler(99, 300)}));
    let url = format!("{}/v1/chat/completions", server.base);
    let writer = std::thread::spawn(move || {
        let _ = ureq::post(&url).timeout(Duration::from_secs(600)).send_json(chat(interrupted, 64));
    });
    // `/health` carries the engine's counts without waiting for a step.
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.get("/health")["engine"]["disk"]["pending_writes"] == 0
        && !writer.is_finished()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = server.stop_with("KILL");
    assert!(!status.success());
    let _ = writer.join();
    drop(server);
    let restarted = Server::start(&flags);
    check_restored(&restarted, &messages, previous);
}

#[test]
fn damaged_page_files_are_recomputed_with_the_same_answer() {
    let dir = TempDir::new("damaged");
    let flags = ["--cache-dir", dir.arg()];
    let mut server = Server::start(&flags);
    let messages = json!([
        {"role": "system", "content": filler(7, 300)},
        {"role": "user", "content": "Which file holds the tests?"}
    ]);
    let first = post_chat(&server, &messages);
    assert_eq!(cached(&first), 0, "an empty cache directory: a cold prefill");
    assert!(server.stop_with("TERM").success());
    drop(server);
    let files = page_files(&dir.0);
    assert!(files.len() >= 2, "a long prompt spans several files: {files:?}");
    for (i, file) in files.iter().enumerate() {
        let mut bytes = std::fs::read(file).unwrap();
        if i % 2 == 0 {
            // A flipped bit in the K/V of some page.
            let at = bytes.len() - 1 - (i * 7919) % (bytes.len() / 2);
            bytes[at] ^= 0x04;
        } else {
            bytes.truncate(bytes.len() * 2 / 3);
        }
        std::fs::write(file, bytes).unwrap();
    }
    let restarted = Server::start(&flags);
    let again = post_chat(&restarted, &messages);
    assert_eq!(content(&again), content(&first), "recomputed, never served: {again}");
    assert!(metric(&restarted, "radix_serve_disk_damaged_files_total") >= 1.0);
    assert!(
        restarted.log().iter().any(|l| l.contains("disk cache") && l.contains("is not used")),
        "a warning names the damaged file: {:?}",
        restarted.log()
    );
}

#[test]
fn the_disk_budget_holds_under_a_larger_workload() {
    let dir = TempDir::new("budget");
    // 4 MiB: about 180 tokens of SmolLM2's K/V (22.5 KiB a token), against ~1000 computed.
    let budget = 4u64 << 20;
    let mut server = Server::start(&["--cache-dir", dir.arg(), "--cache-disk", "0.00390625"]);
    for i in 0..6 {
        let messages = json!([{"role": "user", "content": filler(100 + i, 120)}]);
        post_chat(&server, &messages);
        let disk = wait_written(&server);
        assert_eq!(disk["budget_bytes"], budget);
        assert!(disk["bytes"].as_u64().unwrap() <= budget, "{disk}");
    }
    let disk = server.get("/v1/cache")["disk"].clone();
    assert!(disk["evicted_files"].as_u64().unwrap() >= 1 && disk["files"].as_u64().unwrap() >= 1, "{disk}");
    assert!(server.stop_with("TERM").success());
    let on_disk: u64 = page_files(&dir.0).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    assert!(on_disk <= budget && on_disk > 0, "{on_disk} bytes of page files, budget {budget}");
}

#[test]
fn another_model_file_with_the_same_cache_dir_reuses_nothing() {
    let dir = TempDir::new("models");
    let tiny = workspace_root().join("models/tests/fixtures/tiny/qwen3");
    let template = asset("qwen35_template");
    let start_build = |file: &str, binary: &Path| {
        let mut command = std::process::Command::new(binary);
        let model = tiny.join(file);
        command.args(["-m", model.to_str().unwrap(), "--port", "0", "--threads", "2", "-c", "512"]);
        command.args(["--chat-template-file", template.to_str().unwrap(), "--cache-dir", dir.arg()]);
        Server::start_custom(command)
    };
    let start = |file: &str| start_build(file, &binary());
    let body = json!({"prompt": "the same prompt for both models, long enough to span pages ".repeat(3),
                      "max_tokens": 4, "temperature": 0});
    let completion = |server: &Server| {
        let (status, reply) = server.post("/v1/completions", &body);
        assert_eq!(status, 200, "{reply}");
        cached(&reply)
    };
    // The same architecture and shapes, other weights (f32 against Q8_0): other K/V.
    let mut quantized = start("model-q8_0.gguf");
    assert_eq!(completion(&quantized), 0);
    assert!(quantized.stop_with("TERM").success());
    drop(quantized);
    let mut f32_model = start("model-f32.gguf");
    assert_eq!(f32_model.get("/v1/cache")["disk"]["tokens"], 0, "nothing of the other model is known");
    assert_eq!(completion(&f32_model), 0, "nothing of the other model is reused");
    assert!(f32_model.stop_with("TERM").success());
    drop(f32_model);
    let mut quantized = start("model-q8_0.gguf");
    assert!(completion(&quantized) > 100, "the first model's own cache is still there");
    let models = std::fs::read_dir(&dir.0).unwrap().count();
    assert_eq!(models, 2, "one directory per model");
    assert!(quantized.stop_with("TERM").success());
    drop(quantized);
    // Another build of the server (its executable with one more byte: a build is known by its
    // executable's hash) may compute K/V otherwise: it reuses nothing of the first model's
    // cache and removes it, and leaves the other model's.
    let builds = TempDir::new("other-build");
    std::fs::create_dir_all(&builds.0).unwrap();
    let other_build = builds.0.join("radix-serve");
    std::fs::copy(binary(), &other_build).unwrap();
    std::fs::OpenOptions::new().append(true).open(&other_build).unwrap().write_all(b"\0").unwrap();
    let rebuilt = start_build("model-q8_0.gguf", &other_build);
    assert!(
        rebuilt.log().iter().any(|l| l.contains("removed 1 directories left by other builds of radix-serve")),
        "{:?}",
        rebuilt.log()
    );
    assert_eq!(completion(&rebuilt), 0, "another build reuses nothing");
    let models = std::fs::read_dir(&dir.0).unwrap().count();
    assert_eq!(models, 2, "the f32 model's directory and the new build's");
}

#[test]
fn a_hybrid_session_resumes_from_its_snapshots_on_disk_after_a_restart() {
    let dir = TempDir::new("hybrid");
    let model = workspace_root().join("models/tests/fixtures/tiny/qwen35/model-q8_0.gguf");
    let template = asset("qwen35_template");
    let start = |flags: &[&str]| {
        let mut command = std::process::Command::new(binary());
        command.args(["-m", model.to_str().unwrap(), "--port", "0", "--threads", "2", "-c", "4096"]);
        command.args(["--chat-template-file", template.to_str().unwrap()]).args(flags);
        Server::start_custom(command)
    };
    let flags = ["--cache-dir", dir.arg()];
    let mut server = start(&flags);
    // The toy vocabulary spends a token per byte.
    let mut messages = json!([{"role": "system", "content": filler(3, 120)}]);
    let mut previous = 0;
    for turn in 0..3 {
        messages.as_array_mut().unwrap().push(json!({"role": "user", "content": filler(40 + turn, 15)}));
        let reply = post_chat(&server, &messages);
        previous = prompt_tokens(&reply);
        messages.as_array_mut().unwrap().push(json!({"role": "assistant", "content": content(&reply)}));
    }
    assert!(server.stop_with("TERM").success());
    drop(server);
    let restarted = start(&flags);
    assert!(restarted.log().iter().any(|l| l.contains("state snapshots")), "{:?}", restarted.log());
    let next = post_chat(&restarted, &fourth_turn(messages.clone()));
    // Where memory would have resumed: the last message boundary before the previous reply's
    // header, which the next turn renders without the `<think>` the generation prompt opened
    // (the toy model's replies are all reasoning).
    assert!(cached(&next) * 100 >= previous * 90, "{} of the previous {previous} cached: {next}", cached(&next));
    assert!(next["cache_report"]["restored_from_disk"].as_u64().unwrap_or(0) > 0, "{next}");
    assert!(metric(&restarted, "radix_serve_disk_snapshots_restored_total") >= 1.0);
    drop(restarted);
    let cold = start(&["--no-prefix-cache"]);
    let reference = post_chat(&cold, &fourth_turn(messages));
    assert_eq!(content(&next), content(&reference), "the restored state gives the cold answer");
}
