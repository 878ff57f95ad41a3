//! Starting and stopping the servers `compare` measures: radix-serve and llama.cpp's
//! llama-server on the same GGUF, a fresh process per workload so that no cache carries over.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Which program a server configuration runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// Our binary.
    RadixServe,
    /// llama.cpp's llama-server.
    LlamaServer,
}

/// One server configuration: a label for the report, the program and its extra flags.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The label in tables and pictures.
    pub label: String,
    /// What runs.
    pub program: Program,
    /// Flags beyond the shared ones (model, port, threads, context, template).
    pub extra_args: Vec<String>,
}

/// What every configuration shares.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The GGUF file.
    pub model: PathBuf,
    /// `--threads` / `-t`.
    pub threads: usize,
    /// `-c`: the context length.
    pub ctx: usize,
    /// `--chat-template-file`, given to both servers.
    pub template: Option<PathBuf>,
    /// radix-serve's binary.
    pub radix_serve: PathBuf,
    /// llama-server's binary.
    pub llama_server: PathBuf,
}

/// A started server, killed when dropped.
pub struct RunningServer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its stderr/stdout log.
    pub log: PathBuf,
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The command line of `config` on `port`.
pub fn command_line(config: &ServerConfig, shared: &Shared, port: u16) -> Vec<String> {
    let model = shared.model.display().to_string();
    let mut args: Vec<String> = match config.program {
        Program::RadixServe => vec![
            shared.radix_serve.display().to_string(),
            "-m".into(),
            model,
            "--threads".into(),
            shared.threads.to_string(),
        ],
        Program::LlamaServer => {
            vec![shared.llama_server.display().to_string(), "-m".into(), model, "-t".into(), shared.threads.to_string()]
        }
    };
    args.extend(["--host".into(), "127.0.0.1".into(), "--port".into(), port.to_string()]);
    args.extend(["-c".into(), shared.ctx.to_string()]);
    if let Some(t) = &shared.template {
        args.extend(["--chat-template-file".into(), t.display().to_string()]);
    }
    args.extend(config.extra_args.iter().cloned());
    args
}

/// Starts `config`, logging to `log`, and waits until `GET /health` answers 200.
pub fn start(config: &ServerConfig, shared: &Shared, log: &Path) -> Result<RunningServer> {
    let port = free_port()?;
    let args = command_line(config, shared, port);
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let child = Command::new(&args[0])
        .args(&args[1..])
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .spawn()
        .with_context(|| format!("starting {}", args[0]))?;
    let mut server = RunningServer { child, base: format!("http://127.0.0.1:{port}"), log: log.to_owned() };
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = server.child.try_wait()? {
            bail!("{} exited with {status} while starting; see {}", config.label, log.display());
        }
        if let Ok(r) = ureq::get(&format!("{}/health", server.base)).timeout(Duration::from_secs(5)).call()
            && r.status() == 200
        {
            return Ok(server);
        }
        if Instant::now() > deadline {
            bail!("{} did not become healthy in 5 minutes; see {}", config.label, log.display());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").context("finding a free port")?.local_addr()?.port())
}

impl RunningServer {
    /// Sends one tiny unrelated request, so that first-request costs (thread pools, allocation)
    /// are not charged to the workload.
    pub fn warm_up(&self) -> Result<()> {
        ureq::post(&format!("{}/v1/chat/completions", self.base))
            .timeout(Duration::from_secs(300))
            .send_json(serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}))
            .with_context(|| format!("warm-up request; see {}", self.log.display()))?;
        Ok(())
    }
}
