//! Starting the real `radix-serve` binary on a free loopback port and talking HTTP to it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

// Not every test file needs it.
#[allow(unused_imports)]
pub use radix_e2e::workspace_root;

/// The binary that `cargo build -p radix-serve` made next to the test executable.
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join(format!("radix-serve{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p radix-serve` first (scripts/test.sh does)",
        bin.display()
    );
    bin
}

pub use radix_e2e::asset_path as asset;

/// A running server, killed when dropped.
pub struct Server {
    child: Child,
    pub base: String,
    /// Every line the server wrote to stderr so far.
    log: ServerLog,
}

impl Server {
    /// Starts the server on SmolLM2 with extra flags; waits until it listens.
    pub fn start(extra: &[&str]) -> Server {
        Self::start_with_env(extra, &[])
    }

    /// [`Server::start`] with extra environment variables.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        Self::start_command(spawn(extra, env))
    }

    /// Starts `command`, a radix-serve with whatever flags, binary and working directory the
    /// test chose; waits until it listens (loading and any fetch included, 10 minutes at most).
    pub fn start_custom(command: Command) -> Server {
        Self::start_command(spawn_command(command))
    }

    fn start_command((child, addresses, log): (Child, mpsc::Receiver<(bool, String)>, ServerLog)) -> Server {
        let base = loop {
            match addresses.recv_timeout(Duration::from_secs(600)) {
                Ok((true, url)) => break url,
                Ok((false, _)) => continue,
                Err(_) => panic!("the server reports its address within 10 minutes"),
            }
        };
        Server { child, base, log }
    }

    /// The server process's peak resident memory so far (Linux's `VmHWM`), in MiB.
    #[allow(dead_code)] // Not every test binary measures memory.
    pub fn peak_memory_mib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("Linux /proc");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/PID/status");
        line.split_whitespace().nth(1).and_then(|kib| kib.parse::<u64>().ok()).expect("a number of kB") / 1024
    }

    /// The server's stderr so far, one line per entry.
    #[allow(dead_code)] // Not every test binary reads the log.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    pub fn post(&self, path: &str, body: &Json) -> (u16, Json) {
        match ureq::post(&format!("{}{path}", self.base)).timeout(Duration::from_secs(600)).send_json(body) {
            Ok(r) => (r.status(), r.into_json().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Json::Null)),
            Err(e) => panic!("POST {path}: {e}"),
        }
    }

    pub fn get(&self, path: &str) -> Json {
        ureq::get(&format!("{}{path}", self.base)).call().unwrap().into_json().unwrap()
    }

    /// `GET path` as text (`/metrics`).
    pub fn get_text(&self, path: &str) -> String {
        ureq::get(&format!("{}{path}", self.base)).call().unwrap().into_string().unwrap()
    }

    /// Streams a chat request and returns every `data:` payload in order.
    pub fn stream(&self, body: &Json) -> Vec<String> {
        self.stream_at("/v1/chat/completions", body)
    }

    /// Streams a request to any SSE endpoint and returns every `data:` payload in order.
    pub fn stream_at(&self, path: &str, body: &Json) -> Vec<String> {
        let response = ureq::post(&format!("{}{path}", self.base))
            .timeout(Duration::from_secs(600))
            .send_json(body)
            .expect("streaming request accepted");
        assert_eq!(response.header("content-type"), Some("text/event-stream"));
        BufReader::new(response.into_reader())
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_owned))
            .collect()
    }

    /// Polls `/health` until the engine is idle with every page free or cached.
    pub fn wait_idle(&self) -> Json {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let engine = self.get("/health")["engine"].clone();
            let idle = engine["running"] == 0 && engine["waiting"] == 0;
            let pages = engine["pages_free"].as_u64().unwrap() + engine["pages_cached"].as_u64().unwrap();
            if idle && pages == engine["pages_total"].as_u64().unwrap() {
                return engine;
            }
            assert!(Instant::now() < deadline, "engine never went idle without leaks: {engine}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Server {
    /// Starts the server like [`Server::start`], polling `/health` from the moment the socket is
    /// bound (the server says so before it loads the model) until it is ready. Returns the
    /// server and every `/health` answer seen while it loaded, in order.
    pub fn start_watching_health(extra: &[&str]) -> (Server, Vec<(u16, Json)>) {
        let (child, rx, log) = spawn(extra, &[]);
        let timeout = Duration::from_secs(180);
        let (ready, base) = rx.recv_timeout(timeout).expect("the server reports its address");
        let mut seen = Vec::new();
        if !ready {
            let deadline = Instant::now() + timeout;
            loop {
                if rx.try_recv().is_ok() {
                    break;
                }
                assert!(Instant::now() < deadline, "the server never became ready");
                match ureq::get(&format!("{base}/health")).timeout(Duration::from_secs(5)).call() {
                    Ok(r) => seen.push((r.status(), r.into_json().unwrap_or(Json::Null))),
                    Err(ureq::Error::Status(code, r)) => seen.push((code, r.into_json().unwrap_or(Json::Null))),
                    Err(e) => panic!("GET /health while loading: {e}"),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        (Server { child, base, log }, seen)
    }
}

impl Server {
    /// Sends the server `signal` (`TERM`, `KILL`, as `kill -s` spells them) and waits until it
    /// has exited (two minutes at most: a graceful stop answers what is in progress first).
    /// Returns how it exited.
    pub fn stop_with(&mut self, signal: &str) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-s", signal, &pid]).status().expect("kill runs");
        assert!(sent.success(), "kill -s {signal} {pid}");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The log thread reads what the server wrote last.
                std::thread::sleep(Duration::from_millis(200));
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not exit within 2 minutes of SIG{signal}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A greedy chat request.
pub fn chat(messages: Json, max_tokens: usize) -> Json {
    json!({"model": "smollm2", "messages": messages, "temperature": 0, "max_tokens": max_tokens})
}

/// Deterministic filler prose of our own, about `words` words.
pub fn filler(seed: u64, words: usize) -> String {
    const VOCAB: [&str; 24] = [
        "the", "agent", "reads", "files", "before", "editing", "tests", "must", "pass", "after", "every", "change",
        "keep", "diffs", "small", "and", "explain", "why", "cache", "prefix", "tokens", "server", "local", "model",
    ];
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut out = String::new();
    for i in 0..words {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51afd7ed558ccd);
        x ^= x >> 29;
        out.push_str(VOCAB[(x % VOCAB.len() as u64) as usize]);
        out.push(if i % 12 == 11 { '.' } else { ' ' });
        if i % 60 == 59 {
            out.push('\n');
        }
    }
    out
}

/// Spawns the server on SmolLM2 with extra flags. The receiver gets `(false, url)` when the socket
/// is bound while the model loads and `(true, url)` once requests are served.
/// The server's stderr lines, as they come.
type ServerLog = Arc<Mutex<Vec<String>>>;

fn spawn(extra: &[&str], env: &[(&str, &str)]) -> (Child, mpsc::Receiver<(bool, String)>, ServerLog) {
    let model = asset("smollm2");
    let mut command = Command::new(binary());
    command
        .args(["-m", model.to_str().unwrap(), "--port", "0", "--threads", "2"])
        .args(extra)
        .envs(env.iter().copied());
    spawn_command(command)
}

/// Spawns `command` (a radix-serve, any flags) and follows its stderr as [`spawn`] does.
fn spawn_command(mut command: Command) -> (Child, mpsc::Receiver<(bool, String)>, ServerLog) {
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("radix-serve starts");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let log = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[server] {line}");
            kept.lock().unwrap().push(line.clone());
            if let Some(url) = line.split(" on ").nth(1).and_then(|rest| rest.split(" while the model loads").next())
                && line.contains("while the model loads")
            {
                let _ = tx.send((false, url.trim().to_owned()));
            }
            if let Some(url) = line.split("listening on ").nth(1) {
                let _ = tx.send((true, url.trim().to_owned()));
            }
        }
    });
    (child, rx, log)
}
