//! `cache-bench`: replay agent sessions against OpenAI-compatible servers (see benches/README.md).
//!
//! ```text
//! cache-bench run --base-url http://127.0.0.1:8080/v1 [--api-key K] [--model M] [--label NAME]
//!                 [--workloads single,interleaved] [--seed 1] [--preset full|smollm2] [--out DIR]
//! cache-bench compare --model FILE.gguf [--llama-server PATH] [--radix-serve PATH] [--threads 2]
//!                 [--ctx 8192] [--chat-template-file F] [--preset smollm2] [--out DIR]
//! cache-bench dump --workload single [--seed 1] [--preset full]
//! ```

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use radix_benches::cache_bench::checkpoints::CheckpointCounts;
use radix_benches::cache_bench::client::{self, Endpoint, Measurement};
use radix_benches::cache_bench::servers::{self, Program, ServerConfig, Shared};
use radix_benches::cache_bench::workload::{self, Sizes, Workload};
use radix_benches::cache_bench::{Run, write_outputs};
use radix_benches::cache_bench::{ideal, recorded};

#[derive(Parser)]
#[command(about = "Replay agent sessions against OpenAI-compatible servers and report prefix-cache reuse and TTFT")]
// A flag given twice takes the last value, so that run-cache-bench.sh's EXTRA can override what a
// preset set (`--ctx`, `--radix-args`, `--llama-configs`) instead of being refused.
#[command(args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Replay workloads against one running server.
    Run(RunArgs),
    /// Start radix-serve and llama-server on the same GGUF and replay every workload on each.
    Compare(CompareArgs),
    /// Print a workload's requests as JSON.
    Dump(DumpArgs),
}

#[derive(Args, Clone)]
struct WorkloadArgs {
    /// Comma-separated workloads: single, split-system, interleaved, subagent, compaction,
    /// subagent-branch, edited-system, and `recorded` (the requests in `--recorded FILE`).
    #[arg(long, default_value = "single,split-system,interleaved,subagent,compaction")]
    workloads: String,
    /// Chat requests recorded by `radix-serve --record-requests FILE`, for the `recorded`
    /// workload.
    #[arg(long, value_name = "FILE")]
    recorded: Option<PathBuf>,
    /// Seed of the generated text and schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `full`: measured agent sizes (7-8k-token prefix, results up to 3k tokens; needs a ~32k
    /// context); `smollm2`: a ~3.2k-token prefix, results of 20-600 tokens, prompts under ~7k
    /// tokens, for 8k contexts.
    #[arg(long, default_value = "full")]
    preset: String,
    /// Sessions of the interleaved workload.
    #[arg(long, default_value_t = 4)]
    sessions: usize,
    /// `max_tokens` of every request.
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
}

impl WorkloadArgs {
    fn sizes(&self) -> Result<Sizes> {
        let mut sizes = match self.preset.as_str() {
            "full" => Sizes::full(),
            "smollm2" => Sizes::smollm2(),
            other => bail!("unknown --preset '{other}': use full or smollm2"),
        };
        sizes.sessions = self.sessions;
        sizes.max_tokens = self.max_tokens;
        Ok(sizes)
    }

    fn build(&self) -> Result<Vec<Workload>> {
        let sizes = self.sizes()?;
        self.workloads
            .split(',')
            .map(|name| match (name.trim(), &self.recorded) {
                ("recorded", Some(path)) => recorded::load(path, self.max_tokens),
                ("recorded", None) => bail!("the recorded workload needs --recorded FILE"),
                (name, _) => workload::build(name, self.seed, &sizes).with_context(|| {
                    format!("unknown workload '{name}': use {}, recorded", workload::WORKLOADS.join(", "))
                }),
            })
            .collect()
    }
}

#[derive(Args)]
struct RunArgs {
    /// Base URL of the OpenAI API, up to `/v1`.
    #[arg(long)]
    base_url: String,
    /// Bearer token, if the server wants one.
    #[arg(long)]
    api_key: Option<String>,
    /// The `model` field.
    #[arg(long, default_value = "default")]
    model: String,
    /// The server's name in the report.
    #[arg(long, default_value = "server")]
    label: String,
    /// Where table.md, results.json and the pictures go.
    #[arg(long, default_value = "target/cache-bench")]
    out: PathBuf,
    #[command(flatten)]
    workload: WorkloadArgs,
}

#[derive(Args)]
struct CompareArgs {
    /// The GGUF both servers load.
    #[arg(long)]
    model: PathBuf,
    /// radix-serve binary.
    #[arg(long, default_value = "target/release/radix-serve")]
    radix_serve: PathBuf,
    /// llama-server binary (scripts/build-llama-cpp.sh prints the directory it is in).
    #[arg(long)]
    llama_server: PathBuf,
    /// Threads of each server.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Context length (`-c`) of each server.
    #[arg(long, default_value_t = 8192)]
    ctx: usize,
    /// Chat template file given to both servers (templates that show tools the same way keep the
    /// prompts identical).
    #[arg(long)]
    chat_template_file: Option<PathBuf>,
    /// Extra flags of radix-serve, one string.
    #[arg(long, default_value = "--parallel 4 --kv-cache 1024", allow_hyphen_values = true)]
    radix_args: String,
    /// llama-server configurations to run, `;`-separated, each `label=flags`.
    #[arg(long, default_value = "llama-server=;llama-server -np 1=-np 1 -sps 0", allow_hyphen_values = true)]
    llama_configs: String,
    /// Where table.md, results.json, the pictures and server logs go.
    #[arg(long, default_value = "target/cache-bench")]
    out: PathBuf,
    #[command(flatten)]
    workload: WorkloadArgs,
}

#[derive(Args)]
struct DumpArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
}

fn main() -> Result<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    match Cli::parse().command {
        Cmd::Run(args) => run(args, &command),
        Cmd::Compare(args) => compare(args, &command),
        Cmd::Dump(args) => {
            println!("{}", serde_json::to_string_pretty(&args.workload.build()?)?);
            Ok(())
        }
    }
}

fn progress(server: &str, workload: &str) -> impl FnMut(&Measurement) {
    let (server, workload) = (server.to_owned(), workload.to_owned());
    move |m: &Measurement| {
        eprintln!(
            "[{server} {workload}] #{:<3} {:<14} prompt {:>6} cached {:>6} ttft {:>7.2}s total {:>7.2}s{}",
            m.index + 1,
            m.conversation,
            m.prompt_tokens,
            m.cached_tokens,
            m.ttft_ms / 1e3,
            m.total_ms / 1e3,
            m.error.as_deref().map(|e| format!("  ERROR {e}")).unwrap_or_default()
        )
    }
}

/// The reuse bound of every request of `w`, from the server at `base` (None, said on stderr, when
/// it cannot render and tokenize for us).
fn ideal_for(base: &str, api_key: Option<&str>, w: &Workload) -> Option<Vec<usize>> {
    match ideal::tokenize_prompts(base, api_key, w) {
        Ok(prompts) => Some(ideal::ideal_cached(&prompts)),
        Err(e) => {
            eprintln!("no reuse bound for {}: {e:#}", w.name);
            None
        }
    }
}

fn with_ideal(mut ms: Vec<Measurement>, ideal: &Option<Vec<usize>>) -> Vec<Measurement> {
    if let Some(ideal) = ideal {
        for (m, i) in ms.iter_mut().zip(ideal) {
            m.ideal_cached = Some(*i);
        }
    }
    ms
}

fn run(args: RunArgs, command: &str) -> Result<()> {
    let endpoint =
        Endpoint { base_url: args.base_url.clone(), api_key: args.api_key.clone(), model: args.model.clone() };
    let mut runs = Vec::new();
    let base = args.base_url.trim_end_matches('/').trim_end_matches("/v1");
    for w in args.workload.build()? {
        let ideal = ideal_for(base, args.api_key.as_deref(), &w);
        let measurements = with_ideal(client::replay(&endpoint, &w, progress(&args.label, &w.name)), &ideal);
        runs.push(Run { server: args.label.clone(), workload: w.name.clone(), measurements, checkpoints: None });
    }
    let table = write_outputs(&args.out, &runs, None, args.workload.seed, &args.workload.sizes()?, command)?;
    println!("{table}");
    eprintln!("results in {}", args.out.display());
    Ok(())
}

fn configs(args: &CompareArgs) -> Result<Vec<ServerConfig>> {
    let split = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    let mut out = vec![ServerConfig {
        label: "radix-serve".into(),
        program: Program::RadixServe,
        extra_args: split(&args.radix_args),
    }];
    for entry in args.llama_configs.split(';').filter(|e| !e.trim().is_empty()) {
        let (label, flags) =
            entry.split_once('=').with_context(|| format!("--llama-configs entry '{entry}' is not label=flags"))?;
        out.push(ServerConfig { label: label.trim().into(), program: Program::LlamaServer, extra_args: split(flags) });
    }
    Ok(out)
}

fn compare(args: CompareArgs, command: &str) -> Result<()> {
    for (what, path) in
        [("--radix-serve", &args.radix_serve), ("--llama-server", &args.llama_server), ("--model", &args.model)]
    {
        if !path.is_file() {
            bail!("{what} {} is not a file", path.display());
        }
    }
    let shared = Shared {
        model: args.model.clone(),
        threads: args.threads,
        ctx: args.ctx,
        template: args.chat_template_file.clone(),
        radix_serve: args.radix_serve.clone(),
        llama_server: args.llama_server.clone(),
    };
    let configs = configs(&args)?;
    std::fs::create_dir_all(&args.out)?;
    for c in &configs {
        eprintln!("{}: {}", c.label, servers::command_line(c, &shared, 0).join(" "));
    }
    let mut runs = Vec::new();
    for w in args.workload.build()? {
        let mut ideal = None;
        for c in &configs {
            let log = args.out.join(format!("{}-{}.log", c.label.replace(' ', "_"), w.name));
            let server = servers::start(c, &shared, &log)?;
            server.warm_up()?;
            if ideal.is_none() && c.program == Program::RadixServe {
                ideal = ideal_for(&server.base, None, &w);
            }
            let endpoint = Endpoint { base_url: format!("{}/v1", server.base), api_key: None, model: "default".into() };
            let measurements = client::replay(&endpoint, &w, progress(&c.label, &w.name));
            drop(server);
            let measurements = with_ideal(measurements, &ideal);
            // Read after the process is gone, so its log is complete (llama-server flushes each
            // line; radix-serve's log has no such lines and is not read).
            let checkpoints =
                (c.program == Program::LlamaServer).then(|| CheckpointCounts::from_log_file(&log)).flatten();
            runs.push(Run { server: c.label.clone(), workload: w.name.clone(), measurements, checkpoints });
            // Partial results survive an interrupted comparison.
            write_outputs(&args.out, &runs, Some("radix-serve"), args.workload.seed, &args.workload.sizes()?, command)?;
        }
    }
    let table =
        write_outputs(&args.out, &runs, Some("radix-serve"), args.workload.seed, &args.workload.sizes()?, command)?;
    println!("{table}");
    eprintln!("results in {}", args.out.display());
    Ok(())
}
