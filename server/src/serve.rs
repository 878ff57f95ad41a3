//! `radix-serve` (no subcommand): load a model and serve the HTTP API.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use radix_models::default_model::{FetchProgress, default_model_dir};
use radix_models::tokenizer::Tokenizer;
use radix_models::{
    HubOptions, KvDType, KvPool, KvTypes, LoadOptions, Model, ModelFiles, RecommendedSampling, StatePool, device_name,
    parse_device, resolve_model,
};
use radix_serve::api::{
    ApiError, ApiKeys, ApiState, BrowserPolicy, HttpMetrics, KvCacheInfo, PreparationPool, RequestRecorder, router,
};
use radix_serve::engine::{DiskTier, EngineConfig, EngineCore, EngineHandle, ModelIdentity, build_id};
use radix_serve::kv_budget::{KvRequest, available_host_memory};
use radix_templates::prepare::{ControlSpellings, PreparedTemplate};
use radix_templates::{ChatTemplate, ModelFormat, TemplateSource};

use crate::moe_args::MoeArgs;
use crate::sampling_args::SamplingArgs;
use crate::spec_args::SpecArgs;

/// Options of the server; names follow llama-server's where they mean the same.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Model: a .gguf file, a model directory, or a hub id (`owner/name`, `owner/name:file.gguf`).
    /// Default: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M), fetched into the cache directory.
    #[arg(short = 'm', long)]
    model: Option<String>,
    /// Hub revision (branch, tag or commit) for a hub id.
    #[arg(long)]
    revision: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Context length per sequence (default: the model's trained context).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Most sequences decoding at once.
    #[arg(long = "parallel", default_value_t = 4)]
    parallel: usize,
    /// KV cache budget in MiB (default: `--parallel` full contexts, at least 256 MiB, at most
    /// half the available memory; see the README's "Context and KV cache").
    #[arg(long = "kv-cache")]
    kv_cache_mib: Option<usize>,
    /// Hybrid models (Qwen3.5): MiB of recurrent-state snapshots the prefix cache keeps, so that a
    /// cached prefix can be resumed (default: as much as the KV cache budget; 0 reuses no prefix).
    #[arg(long = "state-cache")]
    state_cache_mib: Option<usize>,
    /// Hybrid models: save the recurrent state at least every this many prompt tokens, besides
    /// message boundaries, so a prompt diverging inside a long message resumes close by.
    #[arg(long, default_value_t = radix_serve::engine::DEFAULT_SNAPSHOT_INTERVAL)]
    snapshot_interval: usize,
    /// Hybrid models: inside the leading system block (tool definitions, system text), also save
    /// the state at a line start at least every this many tokens, so another agent whose prompt
    /// branches inside it (a subagent, another project's instructions) resumes close by (0: off).
    #[arg(long, default_value_t = radix_serve::engine::DEFAULT_BRANCH_SPACING)]
    branch_spacing: usize,
    /// How K is stored (`-ctk`): f16, or q8_0 / q4_0 (GGUF's blocks of 32 values, 8.5 and 4.5
    /// bits a value), which hold 1.88x / 3.56x the tokens of f16 in the same `--kv-cache`
    /// (the CPU path only; f32 and bf16 too).
    #[arg(long = "cache-type-k", value_name = "TYPE", default_value = "f16", value_parser = parse_kv_type)]
    cache_type_k: KvDType,
    /// How V is stored (`-ctv`), as `--cache-type-k`.
    #[arg(long = "cache-type-v", value_name = "TYPE", default_value = "f16", value_parser = parse_kv_type)]
    cache_type_v: KvDType,
    /// Tokens per KV page (1 matches prefixes exactly).
    #[arg(long, default_value_t = 1)]
    page_size: usize,
    /// Most tokens in one forward pass.
    #[arg(long, default_value_t = 512)]
    batch_tokens: usize,
    /// Model threads (default: all cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Where the model runs: `cpu`, `cuda[:N]` (a build with `--features cuda`) or `metal`
    /// (macOS, `--features metal`). The KV cache budget is then GPU memory.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Run the tensor path, the code GPUs run (candle ops, a KV pool of tensors, gathered
    /// attention), on the CPU: slower than the CPU path; for testing that path end to end
    /// without a GPU.
    #[arg(long)]
    tensor_path: bool,
    /// Use this chat template instead of the model's.
    #[arg(long)]
    chat_template_file: Option<PathBuf>,
    /// Never reuse cached prefixes (every request prefills from scratch).
    #[arg(long)]
    no_prefix_cache: bool,
    /// Keep the prefix cache's KV pages on disk too, in this directory (one subdirectory per
    /// model and KV layout): prefixes evicted from memory, or computed before a restart, are
    /// read back instead of prefilled again; a hybrid model's snapshots too.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// GiB of page files `--cache-dir` may hold (default 10); least recently used go first.
    #[arg(long = "cache-disk")]
    cache_disk_gib: Option<f64>,
    /// API key every route but /health requires, as `Authorization: Bearer <key>` or
    /// `x-api-key: <key>`; several may be given comma-separated.
    #[arg(long)]
    api_key: Option<String>,
    /// A key that also sees prompt text in `/v1/cache` (other clients' prompts); without it
    /// nobody does. Also accepted wherever `--api-key` is.
    #[arg(long)]
    admin_api_key: Option<String>,
    /// Let log lines quote prompt text (where a cache reuse stopped); by default they carry
    /// token counts and message indices only.
    #[arg(long)]
    log_prompts: bool,
    /// Append every chat request body, as it arrived, to this file (one JSON line each), to
    /// replay an agent's traffic later (`cache-bench --recorded FILE`). The file holds the
    /// prompts verbatim.
    #[arg(long, value_name = "FILE")]
    record_requests: Option<PathBuf>,
    /// Tokenize control-token spellings in message text (`<|im_start|>` written by a user) as
    /// control tokens, as transformers does with a rendered prompt; by default they are text,
    /// so a message cannot open a turn of another role. For parity tests.
    #[arg(long)]
    content_control_tokens: bool,
    /// Keep Claude Code's `x-anthropic-billing-header: ...` system block in prompts. By default
    /// it is left out: its nonce changes with every request, so every request would miss the
    /// prefix cache from its first tokens on.
    #[arg(long)]
    keep_billing_header: bool,
    /// File with API keys, one per line.
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Host names (comma-separated) accepted in the `Host` header besides IP addresses and
    /// localhost, e.g. the name a reverse proxy or a cluster's service uses; `*` accepts any.
    /// Other names get 403: a guard against DNS-rebinding web pages.
    #[arg(long)]
    allowed_hosts: Option<String>,
    /// Origins (comma-separated `scheme://host[:port]`, or `*`) whose web pages may call the
    /// API (CORS); none by default.
    #[arg(long)]
    cors_origin: Option<String>,
    /// Most requests waiting for admission; generation routes answer 503 beyond it.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    moe: MoeArgs,
    #[command(flatten)]
    spec: SpecArgs,
}

impl ServeArgs {
    /// Model threads: `--threads`, else every core.
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// The default model (`radix_models::default_model`): from the cache, else fetched, with a
/// progress bar on stderr.
fn default_model(hub: &HubOptions) -> anyhow::Result<PathBuf> {
    let dir = default_model_dir()?;
    eprintln!(
        "radix-serve: the default model (no -m given): Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), kept in {}",
        dir.display()
    );
    let mut progress = StderrProgress { shown: None };
    let path = radix_models::default_model::default_model(&dir, hub, &mut progress)?;
    Ok(path)
}

/// `radix-serve default-model`: the default model's path on stdout, fetched first if needed.
pub fn print_default_model() -> anyhow::Result<()> {
    let path = default_model(&HubOptions::from_env())?;
    println!("{}", path.display());
    Ok(())
}

/// A fetch's progress as one rewritten stderr line, redrawn at each whole percent.
struct StderrProgress {
    shown: Option<u64>,
}

impl FetchProgress for StderrProgress {
    fn bytes(&mut self, done: u64, total: u64) {
        let percent = 100 * done / total.max(1);
        if self.shown == Some(percent) {
            return;
        }
        self.shown = Some(percent);
        const WIDTH: u64 = 30;
        let filled = (WIDTH * done / total.max(1)) as usize;
        eprint!(
            "\rradix-serve: fetching [{}{}] {} / {} MB",
            "#".repeat(filled),
            " ".repeat(WIDTH as usize - filled),
            done >> 20,
            total >> 20
        );
        if done >= total {
            eprintln!();
        }
    }

    fn note(&mut self, line: &str) {
        if self.shown.take().is_some_and(|p| p < 100) {
            eprintln!();
        }
        eprintln!("radix-serve: {line}");
    }
}

/// Loads everything, then serves until interrupted.
/// A `--cache-type-k/-v` value.
fn parse_kv_type(name: &str) -> Result<KvDType, String> {
    KvDType::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = KvDType::ALL.iter().map(|t| t.name()).collect();
        format!("unknown KV cache type {name:?}: one of {}", known.join(", "))
    })
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    // A bad sampling or speculation flag fails before the model loads.
    args.sampling.defaults(&RecommendedSampling::default())?;
    args.spec.config().map_err(anyhow::Error::msg)?;
    let api_keys = ApiKeys::load(args.api_key.as_deref(), args.api_key_file.as_deref())?;
    let admin_keys = ApiKeys::load_admin(args.admin_api_key.as_deref())?;
    let recorder = match &args.record_requests {
        Some(path) => Some(
            RequestRecorder::open(path)
                .with_context(|| format!("--record-requests {}: cannot open it for appending", path.display()))?,
        ),
        None => None,
    };
    let browser = BrowserPolicy::new(args.allowed_hosts.as_deref(), args.cors_origin.as_deref())?;
    // Listen before loading, so probes get an honest 503 "loading model" instead of a refused
    // connection; the same socket serves the API once the engine is ready.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("`{}:{}` is not an address to listen on", args.host, args.port))?;
    let socket = std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    if !addr.ip().is_loopback() && !api_keys.enabled() {
        eprintln!(
            "radix-serve: warning: listening on {addr}, beyond this machine, without an API key: anyone who \
             can reach it can use the model and read what is cached; set --api-key"
        );
    }
    socket.set_nonblocking(true)?;
    let local = socket.local_addr()?;
    let (loaded, loading_server) = {
        let _guard = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(socket.try_clone()?)?;
        let (loaded, done) = tokio::sync::oneshot::channel::<()>();
        let server = axum::serve(listener, loading_router()).with_graceful_shutdown(async {
            let _ = done.await;
        });
        (loaded, runtime.spawn(async move { server.await }))
    };
    eprintln!("radix-serve: answering 503 on http://{local} while the model loads");
    let hub = HubOptions { revision: args.revision.clone(), ..HubOptions::from_env() };
    let spec = match &args.model {
        Some(m) => m.clone(),
        None => default_model(&HubOptions { revision: None, ..hub.clone() })?.display().to_string(),
    };
    let files = resolve_model(&spec, &hub)?;
    let threads = args.threads();
    eprintln!("radix-serve: loading {}", files.path().display());
    let mut bar = |done: usize, total: usize| {
        const WIDTH: usize = 30;
        let filled = WIDTH * done / total.max(1);
        eprint!("\rradix-serve: [{}{}] {done}/{total} layers", "#".repeat(filled), " ".repeat(WIDTH - filled));
        if done == total {
            eprintln!();
        }
    };
    let device = parse_device(&args.device).with_context(|| format!("--device {}", args.device))?;
    let on_cpu = device.is_cpu();
    let cpu_moe_layers = args.moe.cpu_moe_layers();
    let wants_head = args.spec.config().map_err(anyhow::Error::msg)?.spec_type.mtp();
    let options = LoadOptions {
        threads,
        device,
        tensor_path: args.tensor_path,
        cpu_moe_layers,
        mtp: wants_head,
        ..LoadOptions::default()
    };
    let model = Model::load_with_progress(files.path(), &options, &mut bar)
        .with_context(|| format!("cannot load {}", files.path().display()))?;
    if wants_head && !model.has_mtp_head() {
        let why = match model.config().mtp_layers {
            0 => "the model carries no multi-token-prediction head (GGUF `nextn_predict_layers`)".to_owned(),
            _ => model.load_notes().iter().find(|n| n.contains("multi-token")).cloned().unwrap_or_default(),
        };
        anyhow::bail!(
            "--spec-type draft-mtp: {why}; use --spec-type ngram, or a Qwen3.5/3.6 GGUF converted with its MTP layers"
        );
    }
    for note in model.load_notes().iter().cloned().chain(args.moe.note(on_cpu, model.config())) {
        eprintln!("radix-serve: {note}");
    }
    let sampling = args.sampling.defaults(model.recommended_sampling())?;
    eprintln!("radix-serve: requests that set no sampling fields get {}", sampling.description);
    let tokenizer = match &files {
        ModelFiles::Gguf(path) => Tokenizer::from_gguf_file(path)?,
        ModelFiles::Directory(dir) => Tokenizer::from_model_dir(dir)?,
    };
    let source = match &args.chat_template_file {
        // The model's own files need no template then, only their special tokens.
        Some(file) => TemplateSource {
            special_tokens: TemplateSource::special_tokens_of(files.path())?,
            ..TemplateSource::from_jinja_file(file)?
        },
        None => match &files {
            ModelFiles::Gguf(path) => TemplateSource::from_gguf(path)?,
            ModelFiles::Directory(dir) => TemplateSource::from_model_dir(dir)?,
        },
    };
    let format = ModelFormat::from_source(&source);
    let template = PreparedTemplate::new(ChatTemplate::new(source)?);
    let mut stop_tokens: Vec<u32> = tokenizer.eos_token_ids().iter().copied().collect();
    for end_of_turn in format.end_of_turn() {
        if let Some(id) = tokenizer.token_to_id(end_of_turn)
            && !stop_tokens.contains(&id)
        {
            stop_tokens.push(id);
        }
    }
    let page_size = args.page_size.max(1);
    let kv_types =
        KvTypes { k: args.cache_type_k, v: args.cache_type_v }.check().context("--cache-type-k / --cache-type-v")?;
    if kv_types.k == KvDType::Q4_0 {
        // Measured (benches/README.md, "Quantized KV"): on Qwen2.5-Coder-0.5B, q4_0 K moves the
        // next-token distribution by 0.84 nats on average even rotated into the Hadamard basis
        // (q8_0 K: 0.003).
        eprintln!(
            "radix-serve: warning: q4_0 K (-ctk q4_0) changes answers a lot on models with outlier K channels \
             (mean KL 0.84 on Qwen2.5-Coder-0.5B); q8_0 K with q4_0 V keeps most of the saving"
        );
    }
    let sizing = KvRequest {
        token_bytes: KvPool::page_bytes(model.config(), 1, kv_types),
        page_size,
        trained_context: model.config().max_position_embeddings,
        ctx_size: args.ctx_size,
        kv_cache_mib: args.kv_cache_mib,
        parallel: args.parallel.max(1),
        available_bytes: if model.device().is_cpu() { available_host_memory() } else { None },
    }
    .size()
    .map_err(anyhow::Error::msg)?;
    for note in &sizing.notes {
        eprintln!("radix-serve: {note}");
    }
    let pool = model
        .kv_pool_with_budget(page_size, sizing.budget_bytes, kv_types)
        .context("--cache-type-k / --cache-type-v")?;
    // As much as the KV budget: llama-server keeps up to 32 state checkpoints per slot (616 MiB
    // for the 0.8B shape), and half the budget (19 snapshots at 768 MiB) lost an idle session's
    // newest turns to a subagent in cache-bench. Host memory is committed only as they are taken.
    let state_cache_bytes = args.state_cache_mib.map_or(sizing.budget_bytes, |mib| mib << 20);
    let hybrid = model.config().hybrid.is_some();
    if hybrid {
        let per_sequence = StatePool::slot_bytes(model.config())?;
        let sequences = args.parallel.max(1);
        let snapshots = if args.no_prefix_cache { 0 } else { state_cache_bytes / per_sequence.max(1) };
        let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
        eprintln!(
            "radix-serve: recurrent state {:.1} MiB per sequence, {sequences} sequence(s): {:.1} MiB; snapshots for \
             prefix reuse: {snapshots} ({:.1} MiB, --state-cache)",
            mib(per_sequence),
            mib(per_sequence * sequences),
            mib(per_sequence * snapshots)
        );
        if snapshots == 0 && !args.no_prefix_cache {
            eprintln!("radix-serve: --state-cache holds no snapshot: this hybrid model will reuse no cached prefix");
        }
    }
    let device = device_name(model.device());
    let model_type = model.config().arch.gguf_name().to_owned();
    let capacity = pool.num_pages() * pool.page_size();
    // A sequence can never be longer than the pool (one page stays spare for the first
    // generated token): a smaller pool lowers the context, so an over-long prompt is a 400 with
    // the usual wording instead of a failure inside the engine.
    let wanted_context = args.ctx_size.unwrap_or(model.config().max_position_embeddings);
    let context_length = wanted_context.min(capacity.saturating_sub(pool.page_size()).max(1));
    let model_name = Path::new(&spec).file_name().map_or(spec.clone(), |n| n.to_string_lossy().into_owned());
    let spec = args.spec.config().map_err(anyhow::Error::msg)?;
    let sources = match (spec.spec_type.ngram(), spec.spec_type.mtp()) {
        (true, true) => format!("prompt lookup, else the model's MTP head (at most {} tokens)", spec.mtp_max),
        (false, true) => format!("the model's MTP head (at most {} tokens, p >= {})", spec.mtp_max, spec.p_min),
        _ => "prompt lookup".to_owned(),
    };
    match (spec.enabled(), model.verifies_drafts()) {
        (true, true) => eprintln!(
            "radix-serve: speculative decoding: {sources}, drafts of {} to {} tokens",
            spec.draft_min.max(1),
            spec.draft_max
        ),
        (true, false) => eprintln!(
            "radix-serve: --spec-type: a hybrid model on {device} cannot verify drafts yet (its recurrent state is \
             advanced in place there); speculative decoding is off"
        ),
        _ => {}
    }
    let config = EngineConfig {
        max_running: args.parallel.max(1),
        batch_tokens: args.batch_tokens.max(1),
        prefix_cache: !args.no_prefix_cache,
        max_context: context_length,
        state_cache_bytes,
        snapshot_interval: args.snapshot_interval.max(1),
        branch_spacing: args.branch_spacing,
        spec,
    };
    let control_spellings = ControlSpellings::new(tokenizer.special_token_texts());
    let content_controls = match args.content_control_tokens {
        true => None,
        false => control_spellings.clone(),
    };
    let tokenizer = Arc::new(tokenizer);
    let disk = disk_tier(&args, files.path(), &model, &pool)?;
    let mut core = EngineCore::new(model, pool, config, Arc::clone(&tokenizer));
    if let Some(disk) = disk {
        core = core.with_disk_tier(disk);
    }
    let engine = EngineHandle::start(core);
    let engine_at_exit = engine.clone();
    let state = Arc::new(ApiState {
        engine,
        tokenizer,
        template,
        format,
        stop_tokens,
        model_name: model_name.clone(),
        sampling_defaults: sampling.params,
        context_length,
        model_type,
        prefix_cache: !args.no_prefix_cache,
        model_path: files.path().display().to_string(),
        total_slots: args.parallel.max(1),
        kv_cache: KvCacheInfo { type_k: kv_types.k, type_v: kv_types.v, capacity_tokens: capacity },
        api_keys,
        admin_keys,
        log_prompts: args.log_prompts,
        content_controls,
        hybrid,
        control_spellings,
        keep_billing_header: args.keep_billing_header,
        browser,
        max_queue: args.max_queue.max(1),
        // One core is left to the async workers and the engine thread, so they answer at once.
        preparation: PreparationPool::new(std::thread::available_parallelism().map_or(1, |n| n.get() - 1)),
        http_metrics: HttpMetrics::default(),
        recorder,
        recent: Default::default(),
    });
    // The tokenizer and the template parsed the GGUF header again after the model's load.
    radix_models::release_freed_heap();
    runtime.block_on(async move {
        // Stop the loading server first: it stops accepting at once, and connections waiting
        // in the socket's backlog are then taken by the real one.
        let _ = loaded.send(());
        // It waits for its open connections; a client holding one open must not delay serving.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), loading_server).await;
        let listener = tokio::net::TcpListener::from_std(socket)?;
        eprintln!(
            "radix-serve: model {model_name}, device {device}, {threads} threads, KV capacity {capacity} tokens \
             ({kv_types}), context {context_length}; listening on http://{local}"
        );
        axum::serve(listener, router(state))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("the HTTP server failed")
    })?;
    // Every request is answered; what the disk tier still has queued is written before exit.
    engine_at_exit.flush_disk();
    eprintln!("radix-serve: stopped");
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM: the HTTP server then stops accepting, answers the
/// requests it has, and the disk tier writes what it has queued.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    eprintln!("radix-serve: shutting down: answering the requests in progress, then writing the disk cache");
}

/// The disk tier of `--cache-dir`, opened for this model and KV layout; `None` without the flag.
fn disk_tier(args: &ServeArgs, weights: &Path, model: &Model, pool: &KvPool) -> anyhow::Result<Option<DiskTier>> {
    let Some(root) = &args.cache_dir else {
        if args.cache_disk_gib.is_some() {
            anyhow::bail!("--cache-disk needs --cache-dir (the directory the disk cache is kept in)");
        }
        return Ok(None);
    };
    let gib = args.cache_disk_gib.unwrap_or(10.0);
    if !gib.is_finite() || gib <= 0.0 {
        anyhow::bail!("--cache-disk {gib}: give the disk cache's size in GiB, a positive number");
    }
    if args.no_prefix_cache {
        eprintln!("radix-serve: warning: --cache-dir is ignored with --no-prefix-cache");
        return Ok(None);
    }
    // One type for both keeps the spelling of the days of one type, so those caches stay valid;
    // every other pair is its own identity. A type stored in the Hadamard basis says so: its
    // pages from before the rotation hold other values under the same name.
    let types = pool.types();
    let spell = |t: KvDType| if t.is_rotated() { format!("{t:?} rotated") } else { format!("{t:?}") };
    let kv_dtype =
        if types.k == types.v { spell(types.k) } else { format!("K {} V {}", spell(types.k), spell(types.v)) };
    let settings = format!(
        "kv dtype {kv_dtype}, page size {}, device {}, tensor path {}\n{:?}",
        pool.page_size(),
        device_name(model.device()),
        args.tensor_path,
        model.config()
    );
    // The build too: another build may compute K/V and states a little otherwise, and what it
    // left must not change this one's answers.
    let build = format!(
        "radix-serve {} {}",
        env!("CARGO_PKG_VERSION"),
        build_id().context("cannot read the server's own executable, which names its disk cache's build")?
    );
    let identity = ModelIdentity::of(weights, &settings, &build)
        .with_context(|| format!("cannot read {} to identify its disk cache", weights.display()))?;
    let budget = (gib * (1u64 << 30) as f64) as u64;
    let opened = match model.config().hybrid.is_some() {
        true => DiskTier::open_hybrid(root, &identity, budget, pool, StatePool::slot_bytes(model.config())?),
        false => DiskTier::open(root, &identity, budget, pool),
    };
    let (disk, found) =
        opened.with_context(|| format!("--cache-dir {}: cannot open the disk cache", root.display()))?;
    eprintln!(
        "radix-serve: disk cache {}: {} tokens in {} files{} ({:.1} MiB of {gib} GiB){}",
        disk.dir().display(),
        found.tokens,
        found.files,
        match model.config().hybrid.is_some() {
            true => format!(", {} state snapshots", found.snapshots),
            false => String::new(),
        },
        found.bytes as f64 / (1 << 20) as f64,
        match found.damaged + found.unusable {
            0 => String::new(),
            _ => format!("; removed {} damaged and {} unreachable files", found.damaged, found.unusable),
        }
    );
    if found.other_builds_removed > 0 {
        eprintln!(
            "radix-serve: disk cache: removed {} directories left by other builds of radix-serve",
            found.other_builds_removed
        );
    }
    Ok(Some(disk))
}

/// What answers while the model loads: `/health` says so with 503 (load balancers and the
/// harness poll it), every other route answers 503 with an OpenAI-style error.
fn loading_router() -> axum::Router {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    axum::Router::new()
        .route(
            "/health",
            axum::routing::get(|| async {
                (StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({"status": "loading model"})))
            }),
        )
        .fallback(|| async { ApiError::Loading.into_response() })
}
