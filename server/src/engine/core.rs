//! The engine: one step schedules (admission, page growth, the batch), runs one forward pass,
//! and postprocesses its logits (tokens, events, endings); every ending then goes through one
//! finish path. Scheduling lives in `scheduler.rs`, everything a request holds in the cache
//! (pages, state slots, snapshots, the disk tier) in `cache/`, sampling and stop strings in
//! `postprocess.rs`.

use std::sync::Arc;
use std::time::Instant;

use radix_models::tokenizer::Tokenizer;
use radix_models::{ForwardBatch, KvPool, Model, MtpDraftRequest, StatePool};
use tokio::sync::mpsc::UnboundedSender;

use super::cache::{Placement, RequestCache, SnapshotSpacing};
use super::cache_report::{CacheReport, RecentPrefix, RecentSequences};
use super::disk_tier::DiskTier;
use super::draft::{SpecConfig, SpecType};
use super::metrics::EngineMetrics;
use super::postprocess::{Logits, Postprocess, Verified};
use super::request::{EngineEvent, FinishReason, GenerateRequest};
use super::scheduler::{Member, Scheduler};
use super::sequence::{Ending, Sequence};
use super::stats::EngineStats;

/// Scheduling limits.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most sequences running at once (`-np`).
    pub max_running: usize,
    /// Most tokens in one forward pass (decode tokens plus prefill chunks).
    pub batch_tokens: usize,
    /// Reuse cached prefixes at all (`--no-prefix-cache` turns it off).
    pub prefix_cache: bool,
    /// Longest context a sequence may reach.
    pub max_context: usize,
    /// Hybrid models: bytes of recurrent-state snapshots the prefix cache may keep
    /// (`--state-cache`); 0 keeps none, so no prefix is reused.
    pub state_cache_bytes: usize,
    /// Hybrid models: a snapshot at least every this many prompt tokens (`--snapshot-interval`),
    /// so that a long message is not recomputed whole when a prompt diverges inside it.
    pub snapshot_interval: usize,
    /// Hybrid models: inside the leading system block, a snapshot at a line start (a request's
    /// `branch_points`) at least every this many tokens (`--branch-spacing`; 0: none).
    pub branch_spacing: usize,
    /// Speculative decoding (`--spec-type` and its limits); off by default.
    pub spec: SpecConfig,
}

impl EngineConfig {
    /// Limits with the defaults of `radix-serve` for everything but the scheduling ones.
    pub fn new(max_running: usize, batch_tokens: usize, prefix_cache: bool, max_context: usize) -> Self {
        EngineConfig {
            max_running,
            batch_tokens,
            prefix_cache,
            max_context,
            state_cache_bytes: 256 << 20,
            snapshot_interval: DEFAULT_SNAPSHOT_INTERVAL,
            branch_spacing: DEFAULT_BRANCH_SPACING,
            spec: SpecConfig::default(),
        }
    }

    /// Where a hybrid sequence's prefill saves its state besides the request's points.
    fn snapshot_spacing(&self) -> SnapshotSpacing {
        SnapshotSpacing { interval: self.snapshot_interval, branch: self.branch_spacing }
    }
}

/// `--snapshot-interval`'s default: a 10k-token tool output is resumed at most 2k tokens back.
pub const DEFAULT_SNAPSHOT_INTERVAL: usize = 2048;

/// `--branch-spacing`'s default: a subagent or another project branching inside the system block
/// resumes at most this far back. OpenCode's 7.4k-token first prompt takes 14 more snapshots
/// (kept while conversations start in that block) and, its chunks ending at them, prefilled
/// 4.6% slower once on average (inside the noise); 512 cost nothing measurable but
/// left a subagent's branch 5.9% over a perfect prefix cache (benches/README.md, issue 32).
pub const DEFAULT_BRANCH_SPACING: usize = 256;

/// How many computed sequences are remembered to explain cache misses: enough for a few
/// concurrent agent sessions with their subagents.
const RECENT_SEQUENCES: usize = 32;

/// A batch the engine has scheduled and not yet run (see [`EngineCore::schedule_step`]).
pub struct ScheduledStep {
    batch: ForwardBatch,
    members: Vec<Member>,
}

/// The engine's state; lives on the engine thread.
pub struct EngineCore {
    model: Model,
    scheduler: Scheduler,
    /// The pools and everything running sequences hold in them.
    cache: RequestCache,
    postprocess: Postprocess,
    /// Recently computed sequences, to explain cache misses.
    recent: RecentSequences,
    metrics: EngineMetrics,
    /// Speculative decoding's settings (off where the model cannot verify drafts).
    spec: SpecConfig,
    /// A prompt token that makes a step panic (debug builds, `RADIX_SERVE_FAULT_TOKEN`): how the
    /// end-to-end tests show that a failed step fails its batch and nothing else.
    fault_token: Option<u32>,
}

impl EngineCore {
    /// An engine over `model` with the given KV pool; `tokenizer` decodes the output to match
    /// stop strings in it.
    ///
    /// A hybrid model (Qwen3.5) gets a recurrent state slot per running sequence and as many
    /// snapshot slots as `state_cache_bytes` holds: a cached prefix's K/V is usable only with
    /// the recurrent state at its end, so the cache saves states at the prompt's structural
    /// points and resumes from the deepest one a new prompt reaches.
    pub fn new(model: Model, pool: KvPool, config: EngineConfig, tokenizer: Arc<Tokenizer>) -> Self {
        let hybrid = model.config().hybrid.is_some();
        let slots = config.max_running.max(1);
        let slot_bytes = if hybrid { StatePool::slot_bytes(model.config()).unwrap_or(0) } else { 0 };
        let snapshot_slots = match (hybrid, config.prefix_cache) {
            (true, true) => config.state_cache_bytes / slot_bytes.max(1),
            _ => 0,
        };
        let state = hybrid
            .then(|| model.new_state_pool(slots + snapshot_slots).expect("a hybrid model's config makes a state pool"));
        let state = state.map(|pool| (pool, slot_bytes));
        let cache = RequestCache::new(pool, state, slots, config.prefix_cache, config.snapshot_spacing());
        let spec = match (model.verifies_drafts(), model.has_mtp_head()) {
            (true, true) => config.spec,
            (true, false) => {
                SpecConfig { spec_type: SpecType::of(config.spec.spec_type.ngram(), false), ..config.spec }
            }
            (false, _) => SpecConfig { spec_type: SpecType::None, ..config.spec },
        };
        EngineCore {
            spec,
            model,
            scheduler: Scheduler::new(slots, config.batch_tokens),
            cache,
            postprocess: Postprocess::new(tokenizer, config.max_context),
            recent: RecentSequences::new(RECENT_SEQUENCES),
            metrics: EngineMetrics::default(),
            fault_token: if cfg!(debug_assertions) {
                std::env::var("RADIX_SERVE_FAULT_TOKEN").ok().and_then(|t| t.parse().ok())
            } else {
                None
            },
        }
    }

    /// Keeps the prefix cache's pages in `disk` too: written as the tree takes them in, read
    /// back when a prompt continues past what the tree holds (ARCHITECTURE.md §3, "Disk tier").
    /// A hybrid model's prefix needs its recurrent state as well: it gets a disk tier only if
    /// that keeps snapshots ([`DiskTier::open_hybrid`]).
    pub fn with_disk_tier(mut self, disk: DiskTier) -> Self {
        self.cache = self.cache.with_disk_tier(disk);
        self
    }

    /// Waits until the disk tier has written everything queued (a graceful shutdown). A hybrid
    /// model's snapshots that only memory kept (those no request was expected to resume from:
    /// message boundaries, intervals) are written first, so a restart after a graceful stop
    /// resumes where memory would have; after a SIGKILL only the expected ones are there.
    pub fn flush_disk(&mut self) {
        self.cache.flush_disk();
    }

    /// Queues a request; its events go to `events`.
    pub fn add(&mut self, request: GenerateRequest, events: UnboundedSender<EngineEvent>) {
        if request.prompt.is_empty() {
            let _ = events.send(EngineEvent::Failed("the prompt is empty".into()));
            return;
        }
        let pages_needed = request.prompt.len().div_ceil(self.cache.page_size()) + 1;
        if pages_needed > self.cache.num_pages() {
            let _ = events.send(EngineEvent::Failed(format!(
                "the prompt needs {pages_needed} KV pages but the pool has {}; raise --kv-cache",
                self.cache.num_pages()
            )));
            return;
        }
        let text = self.postprocess.text(&request);
        self.scheduler.add(Sequence::new(request, events, text, self.spec));
    }

    /// Nothing to do.
    pub fn idle(&self) -> bool {
        self.scheduler.idle()
    }

    /// Current counts.
    pub fn stats(&self) -> EngineStats {
        EngineStats { running: self.scheduler.running().len(), waiting: self.scheduler.waiting(), ..self.cache.stats() }
    }

    /// Every snapshot in the prefix cache: the token key of its prefix and its state (conv then
    /// SSM per layer, as [`StatePool::read_slot`]), to check them against a cold prefill.
    pub fn snapshot_states(&self) -> Vec<(Vec<u32>, Vec<f32>)> {
        self.cache.snapshot_states()
    }

    /// Recently computed sequences, most reused first (for `/v1/cache`).
    pub fn recent_prefixes(&self) -> Vec<RecentPrefix> {
        self.recent.by_use()
    }

    /// Counters and histograms since start-up.
    pub fn metrics(&self) -> EngineMetrics {
        self.cache.metrics(self.metrics.clone())
    }

    /// One step: schedule, run one forward pass, postprocess its logits.
    pub fn step(&mut self) {
        if let Some(scheduled) = self.schedule_step() {
            self.run_step(scheduled);
        }
    }

    /// The first half of [`EngineCore::step`]: ends what clients left, admits what fits and
    /// builds the batch (`None`: nothing to compute). The engine thread publishes its counts
    /// between the halves, so `/health` shows what this step runs, not what the last one ran.
    pub fn schedule_step(&mut self) -> Option<ScheduledStep> {
        self.schedule().map(|(batch, members)| ScheduledStep { batch, members })
    }

    /// The second half of [`EngineCore::step`]: the forward pass and its postprocessing.
    pub fn run_step(&mut self, scheduled: ScheduledStep) {
        let ScheduledStep { batch, members } = scheduled;
        if let Some(token) = self.fault_token
            && batch.tokens.contains(&token)
        {
            panic!("injected fault: the batch holds token {token}");
        }
        let (pool, state) = self.cache.pools();
        let logits = match self.model.forward_pass(&batch, pool, state) {
            Ok(logits) => logits,
            Err(e) => {
                let message = format!("model forward failed: {e}");
                for seq in self.scheduler.take_running() {
                    self.finish(seq, Ending::Failed(message.clone()));
                }
                return;
            }
        };
        for member in members.iter().filter(|m| m.drafted == 0) {
            self.cache.advance(&mut self.scheduler.running_mut()[member.index], member.end);
        }
        let argmax = || logits.argmax().map_err(|e| e.to_string());
        let row = |i: usize| logits.row(i).map_err(|e| e.to_string());
        let on_device = !logits.device().is_cpu() && !logits.is_empty();
        let logits = Logits { on_device, argmax: &argmax, row: &row };
        let outcome = self.postprocess.run(&logits, &members, self.scheduler.running_mut());
        let mut ends = outcome.ends;
        for Verified { index, rows, drafted, accepted } in outcome.verified {
            let seq = &mut self.scheduler.running_mut()[index];
            let end = seq.lease().computed() + rows;
            self.metrics.observe_draft(drafted, accepted);
            if let Err(message) = self.cache.accept_verified(seq, end, &self.model) {
                ends.retain(|&(i, _)| i != index);
                ends.push((index, Ending::Failed(message)));
            }
        }
        self.cache.write_through();
        for (seq, ending) in self.scheduler.remove(ends) {
            self.finish(seq, ending);
        }
        self.debug_check();
    }

    /// Ends what the clients left, admits what fits, grows decoding sequences' pages, and
    /// builds the batch; `None` when there is nothing to compute.
    fn schedule(&mut self) -> Option<(ForwardBatch, Vec<Member>)> {
        for seq in self.scheduler.take_abandoned() {
            self.finish(seq, Ending::Abandoned);
        }
        self.admit();
        for seq in self.scheduler.grow_decode_pages(&mut self.cache) {
            self.finish(seq, Ending::Finished(FinishReason::Length));
        }
        let by_head = self.scheduler.draft(&mut self.cache, self.postprocess.max_context());
        if !by_head.is_empty() {
            self.draft_with_head(&by_head);
        }
        let (batch, members) = self.scheduler.build_batch();
        (!batch.tokens.is_empty()).then_some((batch, members))
    }

    /// Drafts with the model's multi-token-prediction head for the running sequences that
    /// asked (each index with the tokens its reserved pages hold), then gives back the pages of
    /// tokens not drafted. A head that fails drafts nothing this step: drafts change the speed,
    /// never the reply.
    fn draft_with_head(&mut self, wanted: &[(usize, usize)]) {
        let running = self.scheduler.running();
        let requests: Vec<MtpDraftRequest> = wanted
            .iter()
            .map(|&(index, held)| {
                let (seq, lease) = (&running[index], running[index].lease());
                MtpDraftRequest {
                    token: seq.tokens()[lease.computed()],
                    position: lease.computed(),
                    page_table: lease.pages(),
                    state_slot: lease.state_slot().unwrap_or(u32::MAX),
                    max_tokens: held,
                }
            })
            .collect();
        let (pool, state) = self.cache.pools();
        let drafts = match state {
            Some(state) => self.model.draft_mtp(pool, state, &requests, self.spec.p_min),
            None => Err(radix_models::ModelError::Config("the head drafts for hybrid models only".into())),
        };
        let drafts = drafts.unwrap_or_else(|e| {
            eprintln!("radix-serve: the multi-token-prediction head drafted nothing: {e}");
            vec![Vec::new(); wanted.len()]
        });
        for (&(index, held), draft) in wanted.iter().zip(drafts) {
            let seq = &mut self.scheduler.running_mut()[index];
            seq.take_mtp_draft(draft);
            let kept = seq.draft().len();
            self.metrics.observe_head_draft(kept);
            if kept < held {
                self.cache.release_draft(seq, kept);
            }
        }
    }

    /// Admits what fits and tells each admitted client how much of its prompt was cached.
    fn admit(&mut self) {
        for (index, placement) in self.scheduler.admit(&mut self.cache) {
            let seq = &mut self.scheduler.running_mut()[index];
            let report = cache_report(&mut self.recent, seq, &self.cache, placement);
            let (prompt_tokens, cached_tokens) = (seq.prompt_len(), seq.lease().cached_tokens());
            let _ = seq.send(EngineEvent::Started { prompt_tokens, cached_tokens, report: Box::new(report) });
            let now = Instant::now();
            seq.admitted_at(now);
            self.metrics.observe_admission(prompt_tokens, cached_tokens, now.duration_since(seq.arrived()));
        }
    }

    /// The one way a sequence ends, however it ends: its timings are taken once, its latencies
    /// counted (a client gone after its first token too), the client told (unless it is gone),
    /// and its pages go to the cache or the free list.
    fn finish(&mut self, mut seq: Sequence, ending: Ending) {
        let now = Instant::now();
        let failed = matches!(ending, Ending::Failed(_));
        self.metrics.observe_reply(seq.arrived(), seq.first_token(), seq.generated(), now);
        match ending {
            Ending::Finished(reason) => {
                let text = seq.finish_text();
                let timings = seq.timings(now);
                if timings.draft_n > 0 {
                    eprintln!(
                        "radix-serve: speculative: {} of {} drafted tokens accepted; {} tokens in {:.0} ms",
                        timings.draft_n_accepted, timings.draft_n, timings.predicted_n, timings.predicted_ms
                    );
                }
                let _ = seq.send(EngineEvent::Finished { reason, timings, text });
            }
            Ending::Failed(message) => {
                let _ = seq.send(EngineEvent::Failed(message));
            }
            Ending::Abandoned => {}
        }
        let computed = seq.lease().computed();
        self.recent.record(&seq.tokens()[..computed], seq.prompt_len(), seq.request().tenant);
        self.cache.finish(&mut seq, failed);
    }

    /// Cuts the running sequence at `index` (in admission order) back to its first `len`
    /// tokens ([`RequestCache::truncate`]). On an error nothing changed.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "no caller yet: speculative decoding keeps drafts out of the sequence and never truncates; \
                      cache/tests.rs tests it"
        )
    )]
    pub(crate) fn truncate_running(&mut self, index: usize, len: usize) -> Result<(), String> {
        let seq = self.scheduler.running_mut().get_mut(index).ok_or_else(|| format!("no running sequence {index}"))?;
        let text = self.postprocess.text(seq.request());
        self.cache.truncate(seq, len, text)
    }

    /// After a step panicked half-way: fails every running sequence with `message` and starts
    /// the prefix cache afresh, since what the step left in it cannot be trusted. Waiting
    /// requests hold no pages and stay queued; the model is unchanged.
    pub fn recover(&mut self, message: &str) {
        let now = Instant::now();
        for seq in self.scheduler.take_running() {
            self.metrics.observe_reply(seq.arrived(), seq.first_token(), seq.generated(), now);
            let _ = seq.send(EngineEvent::Failed(message.to_owned()));
        }
        self.cache.recover();
    }

    /// Drops every cached prefix (nothing may be running).
    pub fn flush_cache(&mut self) {
        self.cache.flush();
    }

    fn debug_check(&self) {
        if cfg!(debug_assertions)
            && let Err(problem) = self.check_invariants()
        {
            panic!("engine invariant broken: {problem}");
        }
    }

    /// Every page is free, in the tree, or private to exactly one running sequence; locks are
    /// zero when nothing runs; each sequence state slot is free or held by one running sequence,
    /// and each snapshot slot free, in the tree, or held by one.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.cache.check_invariants(self.scheduler.running())
    }
}

/// How much of an admitted prompt was cached, and why not more: compared with the recently
/// computed sequences (ARCHITECTURE.md §3: the previous version of a conversation should be a
/// cached prefix of the next).
fn cache_report(
    recent: &mut RecentSequences,
    seq: &Sequence,
    cache: &RequestCache,
    placement: Placement,
) -> CacheReport {
    let page_size = cache.page_size();
    let prompt = &seq.tokens()[..seq.prompt_len()];
    let previous = recent.most_similar(prompt, page_size, seq.request().tenant);
    let cache_on = cache.serves(seq.request().use_cache);
    let lease = seq.lease();
    let mut report = CacheReport::judge(prompt, lease.cached_tokens(), cache_on, page_size, previous);
    report.no_snapshot(lease.kv_matched(), page_size);
    report.restored_from_disk = placement.restored_from_disk;
    report
}
