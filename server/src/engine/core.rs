//! The engine: one step schedules (admission, page growth, the batch), runs one forward pass,
//! and postprocesses its logits (tokens, events, endings); every ending then goes through one
//! finish path. Scheduling lives in `scheduler.rs`, page ownership in `prefix_cache.rs`,
//! sampling and stop strings in `postprocess.rs`.

use std::sync::Arc;
use std::time::Instant;

use radix_models::tokenizer::Tokenizer;
use radix_models::{ForwardBatch, KvPool, Model, StatePool};
use tokio::sync::mpsc::UnboundedSender;

use super::cache_report::{CacheReport, RecentPrefix, RecentSequences};
use super::disk_tier::{DiskStats, DiskTier};
use super::metrics::EngineMetrics;
use super::postprocess::{Logits, Postprocess};
use super::prefix_cache::PrefixCache;
use super::request::{EngineEvent, FinishReason, GenerateRequest};
use super::scheduler::{Member, Scheduler};
use super::sequence::{Ending, Sequence};

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
        }
    }
}

/// `--snapshot-interval`'s default: a 10k-token tool output is resumed at most 2k tokens back.
pub const DEFAULT_SNAPSHOT_INTERVAL: usize = 2048;

/// A snapshot of the engine's state, for `/health` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Sequences running.
    pub running: usize,
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Pages in the pool.
    pub pages_total: usize,
    /// Free pages.
    pub pages_free: usize,
    /// Pages held by the prefix cache.
    pub pages_cached: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Hybrid models: recurrent-state snapshots in the prefix cache.
    pub snapshots: usize,
    /// Hybrid models: slots set aside for snapshots (the `--state-cache` budget).
    pub snapshot_slots: usize,
    /// Hybrid models: snapshot slots neither in the cache nor held by a running sequence.
    pub snapshot_slots_free: usize,
    /// Hybrid models: bytes of one snapshot (one sequence's recurrent state).
    pub snapshot_bytes: usize,
    /// Hybrid models: state slots for running sequences, and how many of them are free.
    pub state_slots: usize,
    /// See [`EngineStats::state_slots`].
    pub state_slots_free: usize,
    /// The disk tier (`--cache-dir`); `enabled: false` without one.
    pub disk: DiskStats,
}

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
    pool: KvPool,
    /// Hybrid models: one recurrent-state slot per running sequence (the first `max_running`
    /// slots), then the snapshot slots the prefix cache hands out.
    state: Option<StatePool>,
    /// Running-sequence state slots no running sequence holds.
    free_slots: Vec<u32>,
    /// Bytes of one state slot (0 for a dense model).
    slot_bytes: usize,
    snapshot_interval: usize,
    scheduler: Scheduler,
    cache: PrefixCache,
    postprocess: Postprocess,
    /// Recently computed sequences, to explain cache misses.
    recent: RecentSequences,
    metrics: EngineMetrics,
    /// The prefix cache's pages (and a hybrid model's snapshots) on disk too (`--cache-dir`).
    disk: Option<DiskTier>,
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
        let snapshot_range = hybrid.then(|| slots as u32..(slots + snapshot_slots) as u32);
        let cache = PrefixCache::new(pool.page_size(), pool.num_pages(), config.prefix_cache, snapshot_range);
        let state = hybrid
            .then(|| model.new_state_pool(slots + snapshot_slots).expect("a hybrid model's config makes a state pool"));
        EngineCore {
            model,
            pool,
            free_slots: if hybrid { (0..slots as u32).rev().collect() } else { Vec::new() },
            state,
            slot_bytes,
            snapshot_interval: config.snapshot_interval.max(1),
            scheduler: Scheduler::new(slots, config.batch_tokens),
            cache,
            postprocess: Postprocess::new(tokenizer, config.max_context),
            recent: RecentSequences::new(RECENT_SEQUENCES),
            metrics: EngineMetrics::default(),
            disk: None,
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
        if self.cache.serves(true) && (self.state.is_none() || disk.keeps_snapshots()) {
            self.disk = Some(disk);
        }
        self
    }

    /// Waits until the disk tier has written everything queued (a graceful shutdown). A hybrid
    /// model's snapshots that only memory kept (those no request was expected to resume from:
    /// message boundaries, intervals) are written first, so a restart after a graceful stop
    /// resumes where memory would have; after a SIGKILL only the expected ones are there.
    pub fn flush_disk(&mut self) {
        let Some(disk) = self.disk.as_mut() else { return };
        if let Some(state) = &self.state {
            for snapshot in self.cache.snapshot_prefixes() {
                disk.persist_snapshot(snapshot.key(), state, snapshot.slot);
            }
        }
        disk.flush();
    }

    /// Queues a request; its events go to `events`.
    pub fn add(&mut self, request: GenerateRequest, events: UnboundedSender<EngineEvent>) {
        if request.prompt.is_empty() {
            let _ = events.send(EngineEvent::Failed("the prompt is empty".into()));
            return;
        }
        let pages_needed = request.prompt.len().div_ceil(self.pool.page_size()) + 1;
        if pages_needed > self.pool.num_pages() {
            let _ = events.send(EngineEvent::Failed(format!(
                "the prompt needs {pages_needed} KV pages but the pool has {}; raise --kv-cache",
                self.pool.num_pages()
            )));
            return;
        }
        let text = self.postprocess.text(&request);
        self.scheduler.add(Sequence::new(request, events, text));
    }

    /// Nothing to do.
    pub fn idle(&self) -> bool {
        self.scheduler.idle()
    }

    /// Current counts.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.scheduler.running().len(),
            waiting: self.scheduler.waiting(),
            pages_total: self.cache.pages_total(),
            pages_free: self.cache.pages_free(),
            pages_cached: self.cache.pages_cached(),
            page_size: self.cache.page_size(),
            snapshots: self.cache.snapshots_cached(),
            snapshot_slots: self.cache.snapshot_slots(),
            snapshot_slots_free: self.cache.snapshot_slots_free(),
            snapshot_bytes: self.slot_bytes,
            state_slots: if self.state.is_some() { self.scheduler.max_running() } else { 0 },
            state_slots_free: self.free_slots.len(),
            disk: self.disk.as_ref().map(DiskTier::stats).unwrap_or_default(),
        }
    }

    /// Every snapshot in the prefix cache: the token key of its prefix and its state (conv then
    /// SSM per layer, as [`StatePool::read_slot`]), to check them against a cold prefill.
    pub fn snapshot_states(&self) -> Vec<(Vec<u32>, Vec<f32>)> {
        let Some(state) = &self.state else { return Vec::new() };
        let snapshots = self.cache.snapshot_prefixes();
        snapshots.into_iter().map(|s| (s.tokens, state.read_slot(s.slot).expect("a snapshot slot"))).collect()
    }

    /// Recently computed sequences, most reused first (for `/v1/cache`).
    pub fn recent_prefixes(&self) -> Vec<RecentPrefix> {
        self.recent.by_use()
    }

    /// Counters and histograms since start-up.
    pub fn metrics(&self) -> EngineMetrics {
        let evicted = self.cache.evicted_pages();
        EngineMetrics {
            evicted_pages: evicted,
            evicted_tokens: evicted * self.cache.page_size() as u64,
            evicted_snapshots: self.cache.evicted_snapshots(),
            disk: self.disk.as_ref().map(DiskTier::metrics).unwrap_or_default(),
            ..self.metrics.clone()
        }
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
        let logits = match self.model.forward_with_state(&batch, &mut self.pool, self.state.as_mut()) {
            Ok(logits) => logits,
            Err(e) => {
                let message = format!("model forward failed: {e}");
                for seq in self.scheduler.take_running() {
                    self.finish(seq, Ending::Failed(message.clone()));
                }
                return;
            }
        };
        self.advance(&members);
        let argmax = || logits.argmax(1).and_then(|ids| ids.to_vec1::<u32>()).map_err(|e| e.to_string());
        let row = |i: usize| logits.get(i).and_then(|r| r.to_vec1::<f32>()).map_err(|e| e.to_string());
        let on_device = !logits.device().is_cpu() && logits.dim(0).unwrap_or(0) > 0;
        let logits = Logits { on_device, argmax: &argmax, row: &row };
        let ends = self.postprocess.run(&logits, &members, self.scheduler.running_mut());
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
        let (batch, members) = self.scheduler.build_batch();
        (!batch.tokens.is_empty()).then_some((batch, members))
    }

    /// Admits what fits and tells each admitted client how much of its prompt was cached.
    fn admit(&mut self) {
        let page_size = self.cache.page_size();
        for index in self.scheduler.admit(&mut self.cache) {
            let seq = &mut self.scheduler.running_mut()[index];
            if let Some(state) = self.state.as_mut() {
                // The scheduler runs at most as many sequences as there are slots.
                let slot = self.free_slots.pop().expect("a state slot for every running sequence");
                seq.state_slot = Some(slot);
                if let Some(from) = seq.restore_from.take() {
                    // Placed a moment ago: its node is locked, and only a step hands out slots.
                    state.copy_slot(from, slot).expect("snapshot and sequence slots are in the pool");
                }
            }
            // The disk tier may hold more of the prompt than the tree: read it into the
            // sequence's own pages (and a hybrid model's snapshot into its state slot) before
            // its prefill, synchronously.
            let mut restored = 0;
            if let Some(disk) = self.disk.as_mut()
                && self.cache.serves(seq.request.use_cache)
            {
                let key = seq.cache_key(seq.prompt_len - 1);
                restored = match (self.state.as_mut(), seq.state_slot) {
                    (Some(state), Some(slot)) => {
                        let n = disk.restore_resumable(key, seq.cached_tokens, &seq.pages, &mut self.pool, state, slot);
                        // The state read back goes into the tree with the prompt's K/V, so the
                        // next request with this prefix finds it in memory.
                        if n > 0
                            && let Some(snapshot) = self.cache.take_snapshot_slot()
                        {
                            state.copy_slot(slot, snapshot).expect("snapshot and sequence slots are in the pool");
                            seq.snapshots.push((seq.cached_tokens + n, snapshot));
                        }
                        n
                    }
                    _ => disk.restore(key, seq.cached_tokens, &seq.pages, &mut self.pool),
                };
                seq.cached_tokens += restored;
                seq.computed += restored;
                seq.kv_matched = seq.kv_matched.max(seq.cached_tokens);
            }
            if self.state.is_some() && self.cache.serves(seq.request.use_cache) {
                seq.snapshot_points = snapshot_points(seq, page_size, self.snapshot_interval);
            }
            // Compares the prompt with the recently computed sequences (ARCHITECTURE.md §3: the
            // previous version of a conversation should be a cached prefix of the next).
            let prompt = &seq.tokens[..seq.prompt_len];
            let previous = self.recent.most_similar(prompt, page_size, seq.request.tenant);
            let cache_on = self.cache.serves(seq.request.use_cache);
            let mut report = CacheReport::judge(prompt, seq.cached_tokens, cache_on, page_size, previous);
            report.no_snapshot(seq.kv_matched, page_size);
            report.restored_from_disk = restored;
            let _ = seq.events.send(EngineEvent::Started {
                prompt_tokens: seq.prompt_len,
                cached_tokens: seq.cached_tokens,
                report: Box::new(report),
            });
            let now = Instant::now();
            seq.admitted = Some(now);
            self.metrics.observe_admission(seq.prompt_len, seq.cached_tokens, now.duration_since(seq.arrived));
        }
    }

    /// Records what the forward pass computed and saves the states it reached at snapshot
    /// points; a prompt just prefilled is shared at once.
    fn advance(&mut self, members: &[Member]) {
        let page_size = self.cache.page_size();
        for member in members {
            let seq = &mut self.scheduler.running_mut()[member.index];
            if let (Some(state), Some(from)) = (self.state.as_mut(), seq.state_slot) {
                while let Some(point) = seq.snapshot_points.pop_if(|p| *p <= member.end) {
                    if point == member.end
                        && let Some(slot) = self.cache.take_snapshot_slot()
                    {
                        state.copy_slot(from, slot).expect("snapshot and sequence slots are in the pool");
                        seq.snapshots.push((point, slot));
                        // Where a later request is expected to resume: worth keeping past a
                        // restart or the snapshot's eviction.
                        if let Some(disk) = self.disk.as_mut()
                            && seq.expects_resume_at(point)
                        {
                            disk.persist_snapshot(seq.cache_key(point), state, slot);
                        }
                    }
                }
                let mut save = |cache: &mut PrefixCache, reuse: Option<u32>| {
                    let slot = reuse.or_else(|| cache.take_snapshot_slot())?;
                    state.copy_slot(from, slot).expect("snapshot and sequence slots are in the pool");
                    Some(slot)
                };
                let decoded_to_page_end = member.end > seq.prompt_len && member.end.is_multiple_of(page_size);
                if page_size > 1 && decoded_to_page_end && self.cache.serves(seq.request.use_cache) {
                    let reuse = seq.rolling_snapshot.take().map(|(_, slot)| slot);
                    seq.rolling_snapshot = save(&mut self.cache, reuse).map(|slot| (member.end, slot));
                }
            }
            if seq.computed < seq.prompt_len && member.end >= seq.prompt_len {
                self.cache.share_prompt(seq, member.end);
                if let Some(disk) = self.disk.as_mut()
                    && self.cache.serves(seq.request.use_cache)
                {
                    disk.persist(seq.cache_key(member.end), &seq.pages, &self.pool);
                }
            }
            seq.computed = member.end;
        }
    }

    /// The one way a sequence ends, however it ends: its timings are taken once, its latencies
    /// counted (a client gone after its first token too), the client told (unless it is gone),
    /// and its pages go to the cache or the free list.
    fn finish(&mut self, mut seq: Sequence, ending: Ending) {
        let now = Instant::now();
        let failed = matches!(ending, Ending::Failed(_));
        self.metrics.observe_reply(seq.arrived, seq.first_token, seq.generated(), now);
        match ending {
            Ending::Finished(reason) => {
                let text = seq.text.finish();
                let _ = seq.events.send(EngineEvent::Finished { reason, timings: seq.timings(now), text });
            }
            Ending::Failed(message) => {
                let _ = seq.events.send(EngineEvent::Failed(message));
            }
            Ending::Abandoned => {}
        }
        self.recent.record(&seq.tokens[..seq.computed], seq.prompt_len, seq.request.tenant);
        self.save_final_snapshot(&mut seq, failed);
        // Before the release frees the pages the tree does not take (a failed step's K/V may be
        // half written: not kept).
        if let Some(disk) = self.disk.as_mut()
            && !failed
            && self.cache.serves(seq.request.use_cache)
        {
            disk.persist(seq.cache_key(seq.computed), &seq.pages, &self.pool);
        }
        self.cache.release(&mut seq);
        if let Some(slot) = seq.state_slot.take() {
            self.free_slots.push(slot);
        }
    }

    /// A hybrid sequence's state where its cached KV will end, so that the next turn (prompt,
    /// this reply, more) resumes there: the state itself when it ends on a page boundary, else
    /// the last boundary decoding crossed. Not after a failed step, which may have written the
    /// state past what was computed.
    fn save_final_snapshot(&mut self, seq: &mut Sequence, failed: bool) {
        let rolling = seq.rolling_snapshot.take();
        let (Some(state), Some(from)) = (self.state.as_mut(), seq.state_slot) else { return };
        let end = seq.computed;
        let wanted = !failed && end > 0 && self.cache.serves(seq.request.use_cache);
        let have = |len: usize| seq.snapshots.iter().any(|&(l, _)| l == len);
        if wanted && end.is_multiple_of(self.cache.page_size()) && !have(end) {
            if let Some((_, slot)) = rolling {
                self.cache.free_snapshot(slot);
            }
            if let Some(slot) = self.cache.take_snapshot_slot() {
                state.copy_slot(from, slot).expect("snapshot and sequence slots are in the pool");
                seq.snapshots.push((end, slot));
                if let Some(disk) = self.disk.as_mut() {
                    disk.persist_snapshot(seq.cache_key(end), state, slot);
                }
            }
            return;
        }
        if let Some((len, slot)) = rolling {
            match wanted && !have(len) {
                true => {
                    seq.snapshots.push((len, slot));
                    if let Some(disk) = self.disk.as_mut() {
                        disk.persist_snapshot(seq.cache_key(len), state, slot);
                    }
                }
                false => self.cache.free_snapshot(slot),
            }
        }
    }

    /// After a step panicked half-way: fails every running sequence with `message` and starts
    /// the prefix cache afresh, since what the step left in it cannot be trusted. Waiting
    /// requests hold no pages and stay queued; the model is unchanged.
    pub fn recover(&mut self, message: &str) {
        let now = Instant::now();
        for seq in self.scheduler.take_running() {
            self.metrics.observe_reply(seq.arrived, seq.first_token, seq.generated(), now);
            let _ = seq.events.send(EngineEvent::Failed(message.to_owned()));
        }
        self.cache = self.cache.emptied();
        if self.state.is_some() {
            self.free_slots = (0..self.scheduler.max_running() as u32).rev().collect();
        }
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
        self.cache.check_invariants(self.scheduler.running())?;
        if let Some(disk) = &self.disk {
            disk.check_invariants()?;
        }
        if self.state.is_some() {
            let mut slots: Vec<u32> = self.scheduler.running().iter().filter_map(|s| s.state_slot).collect();
            if slots.len() != self.scheduler.running().len() {
                return Err("a running sequence of a hybrid model has no state slot".into());
            }
            slots.extend(&self.free_slots);
            slots.sort_unstable();
            if slots != (0..self.scheduler.max_running() as u32).collect::<Vec<_>>() {
                return Err(format!("state slots are not each held once: {slots:?}"));
            }
        }
        Ok(())
    }
}

/// Where a hybrid sequence's prefill saves its state: the request's structural points (message
/// boundaries, from the API), one every `interval` tokens between them so a long message is not
/// recomputed whole, all but the last prompt token (the same prompt sent again resumes there,
/// and so does the next turn of a template that writes the reply's start in other tokens than
/// the generation prompt's last), and where its KV match ended when that was past the
/// snapshot it resumed from: a branch point the traffic has shown (a session in another folder
/// whose system prompt differs inside one message), so the next prompt branching there resumes
/// there. Each rounded down to a page boundary (a prefix is reused in whole pages anyway), past
/// what is cached; descending, the next one last.
fn snapshot_points(seq: &Sequence, page_size: usize, interval: usize) -> Vec<usize> {
    let reusable = seq.prompt_len - 1;
    let mut marks: Vec<usize> = seq.request.snapshot_points.iter().copied().filter(|&p| p <= reusable).collect();
    marks.push(reusable);
    if seq.kv_matched > seq.cached_tokens {
        marks.push(seq.kv_matched);
    }
    marks.sort_unstable();
    marks.dedup();
    let mut points = Vec::new();
    let mut previous = 0;
    for mark in marks {
        points.extend((previous + interval..mark).step_by(interval));
        points.push(mark);
        previous = mark;
    }
    let mut points: Vec<usize> =
        points.into_iter().map(|p| p / page_size * page_size).filter(|&p| p > seq.cached_tokens).collect();
    points.dedup();
    points.reverse();
    points
}
