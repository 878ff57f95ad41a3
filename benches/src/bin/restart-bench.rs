//! `restart-bench`: what the disk tier (`--cache-dir`) saves across a restart. One agent-shaped
//! session (a long system prompt, then turns that each append a reply and a user message)
//! against radix-serve: the cold first turn, a warm second turn, then the server is stopped
//! (SIGTERM, or SIGKILL once its writes are done) and started again on the same cache
//! directory, and the third turn is timed; a restart without `--cache-dir` is the baseline.
//! Each turn asks for one token, so its time is the time to first token plus one decode step.
//!
//! ```sh
//! cargo build --release -p radix-serve -p radix-benches --bin restart-bench
//! target/release/restart-bench --model $(scripts/assets.sh path smollm2) --words 5000
//! ```

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value as Json, json};

/// Command-line options.
#[derive(Debug, Parser)]
struct Args {
    /// The GGUF model.
    #[arg(long)]
    model: PathBuf,
    /// radix-serve's binary (default: next to this one).
    #[arg(long)]
    radix_serve: Option<PathBuf>,
    /// Words of system prompt (about 1.2 tokens each).
    #[arg(long, default_value_t = 5000)]
    words: usize,
    /// Model threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Port to use.
    #[arg(long, default_value_t = 18931)]
    port: u16,
}

/// A started radix-serve.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(binary: &PathBuf, args: &Args, extra: &[&str]) -> Result<(Server, Duration)> {
        let started = Instant::now();
        let child = Command::new(binary)
            .args(["-m", args.model.to_str().context("model path")?, "--threads", &args.threads.to_string()])
            .args(["--port", &args.port.to_string(), "-c", "16384", "--parallel", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let base = format!("http://127.0.0.1:{}", args.port);
        let server = Server { child, base };
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if let Ok(r) = ureq::get(&format!("{}/health", server.base)).timeout(Duration::from_secs(5)).call()
                && r.status() == 200
            {
                return Ok((server, started.elapsed()));
            }
            if Instant::now() > deadline {
                bail!("the server did not become ready");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One turn asking for a single token: (seconds, prompt tokens, cached tokens).
    fn turn(&self, messages: &Json) -> Result<(f64, u64, u64)> {
        let body = json!({"messages": messages, "max_tokens": 1, "temperature": 0});
        let started = Instant::now();
        let reply: Json = ureq::post(&format!("{}/v1/chat/completions", self.base))
            .timeout(Duration::from_secs(3600))
            .send_json(body)?
            .into_json()?;
        let seconds = started.elapsed().as_secs_f64();
        let usage = &reply["usage"];
        Ok((
            seconds,
            usage["prompt_tokens"].as_u64().unwrap_or(0),
            usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        ))
    }

    /// Waits until the disk tier has written everything queued.
    fn wait_written(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(600);
        while Instant::now() < deadline {
            let cache: Json = ureq::get(&format!("{}/v1/cache", self.base)).call()?.into_json()?;
            if cache["disk"]["pending_writes"] == 0 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("the disk tier never finished writing")
    }

    /// Sends `signal` and waits for the exit; the seconds it took.
    fn stop(mut self, signal: &str) -> Result<f64> {
        let started = Instant::now();
        Command::new("kill").args(["-s", signal, &self.child.id().to_string()]).status()?;
        self.child.wait()?;
        Ok(started.elapsed().as_secs_f64())
    }
}

/// Deterministic prose of our own, `words` words.
fn filler(seed: u64, words: usize) -> String {
    const VOCAB: [&str; 16] = [
        "read", "the", "file", "before", "editing", "run", "tests", "after", "each", "change", "keep", "diffs",
        "small", "explain", "why", "agent",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..words)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            VOCAB[(x % VOCAB.len() as u64) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> Result<()> {
    let args = Args::parse();
    let binary = match &args.radix_serve {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("radix-serve"),
    };
    let dir = std::env::temp_dir().join(format!("radix-restart-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let system = format!("You are a coding agent.\n{}", filler(1, args.words));
    let turn = |n: usize| {
        let mut messages = vec![json!({"role": "system", "content": system})];
        for k in 0..n {
            messages.push(json!({"role": "user", "content": format!("Step {k}: {}", filler(10 + k as u64, 30))}));
            if k + 1 < n {
                messages.push(json!({"role": "assistant", "content": format!("Done with step {k}.")}));
            }
        }
        Json::Array(messages)
    };
    let cache_flags = ["--cache-dir", dir.to_str().context("temp dir")?];
    println!("| run | turn | prompt tokens | cached | seconds | vs the run's cold turn 1 |");
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    let row = |run: &str, name: &str, (s, p, c): (f64, u64, u64), cold: f64| {
        println!("| {run} | {name} | {p} | {c} | {s:.2} | {:.3} |", s / cold);
    };
    let mut cold = 1.0;
    for signal in ["TERM", "KILL"] {
        let _ = std::fs::remove_dir_all(&dir);
        let (server, _) = Server::start(&binary, &args, &cache_flags)?;
        let first = server.turn(&turn(1))?;
        cold = first.0;
        row(&format!("--cache-dir, SIG{signal}"), "1 (cold)", first, cold);
        row(&format!("--cache-dir, SIG{signal}"), "2 (warm)", server.turn(&turn(2))?, cold);
        if signal == "KILL" {
            server.wait_written()?;
        }
        let stopped = server.stop(signal)?;
        let (server, start) = Server::start(&binary, &args, &cache_flags)?;
        eprintln!("SIG{signal}: stopped in {stopped:.2} s, ready again in {:.2} s", start.as_secs_f64());
        row(&format!("--cache-dir, SIG{signal}"), "3 (after restart)", server.turn(&turn(3))?, cold);
        server.stop("TERM")?;
    }
    let (server, _) = Server::start(&binary, &args, &[])?;
    row("no --cache-dir", "3 (after restart)", server.turn(&turn(3))?, cold);
    server.stop("TERM")?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
