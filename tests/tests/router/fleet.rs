//! The pieces of tests/tests/router.rs: SGLang's router as a child process, the interleaved agent
//! sessions, and a replay that records, per request, its cache split, the instance that served
//! it (from the instances' `/metrics`), its status and how long it took.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::common::{Server, filler, workspace_root};

/// The router launcher (`smg`) from scripts/router-env.sh, or why it cannot be had.
pub fn router_launcher() -> Result<String, String> {
    let script = workspace_root().join("scripts/router-env.sh");
    let out = Command::new("bash").arg(&script).output().map_err(|e| format!("bash did not run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/router-env.sh failed (installing sglang-router needs PyPI once):\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8(out.stdout).expect("utf-8 path").trim().to_owned())
}

/// A free loopback port (the router takes a port number, not 0).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running sglang-router, killed when dropped.
pub struct Router {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Router {
    /// Starts the router with `policy` in front of `workers` (base URLs), with quick health checks
    /// and few retries so that a dead worker is noticed within seconds; waits until every worker
    /// is registered and healthy.
    pub fn start(launcher: &str, workers: &[String], policy: &str) -> Router {
        let port = free_port();
        let mut command = Command::new(launcher);
        command
            .args(["launch", "--host", "127.0.0.1", "--port", &port.to_string(), "--policy", policy])
            .arg("--worker-urls")
            .args(workers)
            .args(["--prometheus-host", "127.0.0.1", "--prometheus-port", &free_port().to_string()])
            .args(["--log-level", "warn", "--health-check-interval-secs", "1", "--health-failure-threshold", "2"])
            .args(["--health-check-timeout-secs", "2", "--retry-max-retries", "3", "--retry-initial-backoff-ms", "100"])
            .args(["--retry-max-backoff-ms", "1000", "--cb-failure-threshold", "2", "--request-timeout-secs", "60"])
            .args(["--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1"]);
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("the router starts");
        let log = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let kept = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    eprintln!("[router] {line}");
                    kept.lock().unwrap().push(line);
                }
            });
        }
        let router = Router { child, base: format!("http://127.0.0.1:{port}"), log };
        router.wait_for_workers(workers.len());
        router
    }

    /// Polls the router's `/workers` until `n` workers are registered and healthy (60 s at most).
    fn wait_for_workers(&self, n: usize) -> Json {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = ureq::get(&format!("{}/workers", self.base)).timeout(Duration::from_secs(5)).call()
                && let Ok(workers) = r.into_json::<Json>()
                && workers["workers"]
                    .as_array()
                    .is_some_and(|w| w.len() == n && w.iter().all(|w| w["is_healthy"] == true))
            {
                return workers;
            }
            assert!(
                Instant::now() < deadline,
                "the router did not register {n} healthy workers within 60 s; its log:\n{}",
                self.log.lock().unwrap().join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The router's `/workers` answer.
    pub fn workers(&self) -> Json {
        ureq::get(&format!("{}/workers", self.base)).call().unwrap().into_json().unwrap()
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sessions, all sharing one system prompt.
pub const SESSIONS: usize = 4;
/// Requests per session: the first, then one per tool step.
pub const TURNS: usize = 5;

/// The interleaved agent sessions as `(session, request body)` in sending order: turn 0 of every
/// session, then turn 1 of every session, and so on. Each request's messages are the previous
/// request's, the scripted assistant reply (a tool call written as text), and a tool result: the
/// append-only shape of cache-bench's workloads; scripted replies keep every replay identical.
pub fn interleaved_sessions() -> Vec<(usize, Json)> {
    let system = format!("You are a coding agent working in a repository. Rules:\n{}", filler(1, 240));
    let mut conversations: Vec<Vec<Json>> = (0..SESSIONS)
        .map(|s| {
            vec![
                json!({"role": "system", "content": system}),
                json!({"role": "user", "content": format!("Task {s}: {}", filler(100 + s as u64, 50))}),
            ]
        })
        .collect();
    let mut requests = Vec::new();
    for turn in 0..TURNS {
        for (s, messages) in conversations.iter_mut().enumerate() {
            if turn > 0 {
                let seed = (1000 * s + turn) as u64;
                messages.push(
                    json!({"role": "assistant", "content": format!("I will read file {turn}. {}", filler(seed, 20))}),
                );
                messages.push(
                    json!({"role": "user", "content": format!("Tool result {turn}:\n{}", filler(seed + 500, 50))}),
                );
            }
            let body = json!({"model": "smollm2", "messages": messages, "temperature": 0, "max_tokens": 4});
            requests.push((s, body));
        }
    }
    requests
}

/// One request's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The session it belongs to.
    pub session: usize,
    /// The HTTP status, or `None` when no answer came (connection error, timeout).
    pub status: Option<u16>,
    /// `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens` of a 200.
    pub prompt_tokens: u64,
    /// See [`Outcome::prompt_tokens`].
    pub cached_tokens: u64,
    /// Which instance admitted it (index into the fleet), from the instances' counters.
    pub instance: Option<usize>,
    /// Time to the answer or the failure.
    pub elapsed: Duration,
    /// The error's text, for a failure.
    pub error: Option<String>,
    /// The `x-session-affinity` the answer carried.
    pub echoed_key: Option<String>,
}

/// `radix_serve_requests_admitted_total` of a live instance; `None` when it does not answer.
pub fn admitted(server: &Server) -> Option<u64> {
    let text = ureq::get(&format!("{}/metrics", server.base))
        .timeout(Duration::from_secs(5))
        .call()
        .ok()?
        .into_string()
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("radix_serve_requests_admitted_total "))
        .and_then(|v| v.trim().parse().ok())
}

/// Longest a routed request may take before it counts as hung.
pub const REQUEST_BOUND: Duration = Duration::from_secs(45);

/// Sends one chat request to `base`, with the session's routing key when `keyed`.
fn send(base: &str, session: usize, body: &Json, keyed: bool) -> Outcome {
    let mut request = ureq::post(&format!("{base}/v1/chat/completions")).timeout(REQUEST_BOUND * 2);
    if keyed {
        request = request.set("x-smg-routing-key", &format!("session-{session}"));
    }
    let started = Instant::now();
    let answer = request.send_json(body);
    let elapsed = started.elapsed();
    let mut outcome = Outcome {
        session,
        status: None,
        prompt_tokens: 0,
        cached_tokens: 0,
        instance: None,
        elapsed,
        error: None,
        echoed_key: None,
    };
    match answer {
        Ok(r) => {
            outcome.status = Some(r.status());
            outcome.echoed_key = r.header("x-session-affinity").map(str::to_owned);
            let json: Json = r.into_json().unwrap_or(Json::Null);
            outcome.prompt_tokens = json["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            outcome.cached_tokens = json["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        }
        Err(ureq::Error::Status(code, r)) => {
            outcome.status = Some(code);
            outcome.error = Some(r.into_string().unwrap_or_default());
        }
        Err(e) => outcome.error = Some(e.to_string()),
    }
    outcome
}

/// What a replay did.
#[derive(Debug, Clone)]
pub struct Replay {
    /// What was replayed, for the report.
    pub name: String,
    /// Every request, in sending order.
    pub outcomes: Vec<Outcome>,
    /// The instance killed, and after how many requests.
    pub killed: Option<(usize, usize)>,
}

impl Replay {
    /// Sum of cached over sum of prompt tokens of the answered requests.
    pub fn hit_ratio(&self) -> f64 {
        let (cached, prompt) =
            self.outcomes.iter().fold((0, 0), |(c, p), o| (c + o.cached_tokens, p + o.prompt_tokens));
        if prompt == 0 { 0.0 } else { cached as f64 / prompt as f64 }
    }

    /// Requests admitted per instance.
    pub fn load(&self, instances: usize) -> Vec<usize> {
        let mut load = vec![0; instances];
        for o in &self.outcomes {
            if let Some(i) = o.instance {
                load[i] += 1;
            }
        }
        load
    }

    /// Requests that did not get a 200.
    pub fn errors(&self) -> Vec<&Outcome> {
        self.outcomes.iter().filter(|o| o.status != Some(200)).collect()
    }

    /// One line for the report.
    pub fn summary(&self, instances: usize) -> String {
        let slowest = self.outcomes.iter().map(|o| o.elapsed).max().unwrap_or_default();
        let errors: Vec<String> =
            self.errors().iter().map(|o| format!("{:?} in {:.1}s", o.status, o.elapsed.as_secs_f64())).collect();
        format!(
            "{:<34} hit ratio {:>5.1}%  load per instance {:?}  errors {} {:?}  slowest {:.1}s{}",
            self.name,
            100.0 * self.hit_ratio(),
            self.load(instances),
            errors.len(),
            errors,
            slowest.as_secs_f64(),
            self.killed.map(|(i, n)| format!("  (instance {i} killed after request {n})")).unwrap_or_default()
        )
    }
}

/// Sends `requests` one at a time to `base` (the router, or one instance); tells which instance
/// admitted each by the counters of `fleet` (a `None` slot is a killed instance). With
/// `kill_after = Some(n)`, the instance that served the most requests so far is killed after the
/// n-th request.
pub fn replay(
    name: &str,
    base: &str,
    fleet: &mut [Option<Server>],
    requests: &[(usize, Json)],
    keyed: bool,
    kill_after: Option<usize>,
) -> Replay {
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut killed = None;
    for (n, (session, body)) in requests.iter().enumerate() {
        if kill_after == Some(n) {
            let served = Replay { name: String::new(), outcomes: outcomes.clone(), killed: None }.load(fleet.len());
            let busiest = (0..fleet.len()).filter(|&i| fleet[i].is_some()).max_by_key(|&i| served[i]).unwrap();
            eprintln!("router test: killing instance {busiest} after request {n}");
            drop(fleet[busiest].take());
            killed = Some((busiest, n));
        }
        let before: Vec<Option<u64>> = fleet.iter().map(|s| s.as_ref().and_then(admitted)).collect();
        let mut outcome = send(base, *session, body, keyed);
        let after: Vec<Option<u64>> = fleet.iter().map(|s| s.as_ref().and_then(admitted)).collect();
        let grew: Vec<usize> =
            (0..fleet.len()).filter(|&i| matches!((before[i], after[i]), (Some(b), Some(a)) if a > b)).collect();
        outcome.instance = grew.first().copied();
        assert!(grew.len() <= 1, "one request admitted by several instances: {grew:?}");
        outcomes.push(outcome);
    }
    Replay { name: name.to_owned(), outcomes, killed }
}

/// Empties every live instance's prefix cache (`POST /flush_cache`) and waits until it is empty,
/// so that each replay starts cold.
pub fn flush(fleet: &[Option<Server>]) {
    for server in fleet.iter().flatten() {
        let r = ureq::post(&format!("{}/flush_cache", server.base)).call().expect("POST /flush_cache");
        assert_eq!(r.status(), 200);
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.get("/v1/cache")["pages_cached"] != 0 {
            assert!(Instant::now() < deadline, "the cache was not flushed within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
