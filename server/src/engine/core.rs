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
}

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
    /// Hybrid models: one recurrent-state slot per running sequence.
    state: Option<StatePool>,
    /// State slots no running sequence holds.
    free_slots: Vec<u32>,
    scheduler: Scheduler,
    cache: PrefixCache,
    postprocess: Postprocess,
    /// Recently computed sequences, to explain cache misses.
    recent: RecentSequences,
    metrics: EngineMetrics,
    /// A prompt token that makes a step panic (debug builds, `RADIX_SERVE_FAULT_TOKEN`): how the
    /// end-to-end tests show that a failed step fails its batch and nothing else.
    fault_token: Option<u32>,
}

impl EngineCore {
    /// An engine over `model` with the given KV pool; `tokenizer` decodes the output to match
    /// stop strings in it.
    ///
    /// A hybrid model (Qwen3.5) gets a recurrent state slot per running sequence, and no
    /// prefix reuse: a cached prefix's K/V is usable only with the recurrent state at its end,
    /// which nothing saves yet, so every prompt is prefilled whole.
    pub fn new(model: Model, pool: KvPool, config: EngineConfig, tokenizer: Arc<Tokenizer>) -> Self {
        let hybrid = model.config().hybrid.is_some();
        let reuse = config.prefix_cache && !hybrid;
        let cache = PrefixCache::new(pool.page_size(), pool.num_pages(), reuse);
        let slots = config.max_running.max(1);
        let state = hybrid.then(|| model.new_state_pool(slots).expect("a hybrid model's config makes a state pool"));
        EngineCore {
            model,
            pool,
            free_slots: if hybrid { (0..slots as u32).rev().collect() } else { Vec::new() },
            state,
            scheduler: Scheduler::new(config.max_running, config.batch_tokens),
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
        }
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
            if self.state.is_some() {
                // The scheduler runs at most as many sequences as there are slots.
                seq.state_slot = Some(self.free_slots.pop().expect("a state slot for every running sequence"));
            }
            // Compares the prompt with the recently computed sequences (ARCHITECTURE.md §3: the
            // previous version of a conversation should be a cached prefix of the next).
            let prompt = &seq.tokens[..seq.prompt_len];
            let previous = self.recent.most_similar(prompt, page_size, seq.request.tenant);
            let cache_on = self.cache.serves(seq.request.use_cache);
            let report = CacheReport::judge(prompt, seq.cached_tokens, cache_on, page_size, previous);
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

    /// Records what the forward pass computed; a prompt just prefilled is shared at once.
    fn advance(&mut self, members: &[Member]) {
        for member in members {
            let seq = &mut self.scheduler.running_mut()[member.index];
            if seq.computed < seq.prompt_len && member.end >= seq.prompt_len {
                self.cache.share_prompt(seq, member.end);
            }
            seq.computed = member.end;
        }
    }

    /// The one way a sequence ends, however it ends: its timings are taken once, its latencies
    /// counted (a client gone after its first token too), the client told (unless it is gone),
    /// and its pages go to the cache or the free list.
    fn finish(&mut self, mut seq: Sequence, ending: Ending) {
        let now = Instant::now();
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
        self.cache.release(&seq);
        if let Some(slot) = seq.state_slot.take() {
            self.free_slots.push(slot);
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
        if let Some(state) = &self.state {
            self.free_slots = (0..state.num_slots() as u32).rev().collect();
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
    /// zero when nothing runs.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.cache.check_invariants(self.scheduler.running())?;
        if let Some(state) = &self.state {
            let mut slots: Vec<u32> = self.scheduler.running().iter().filter_map(|s| s.state_slot).collect();
            if slots.len() != self.scheduler.running().len() {
                return Err("a running sequence of a hybrid model has no state slot".into());
            }
            slots.extend(&self.free_slots);
            slots.sort_unstable();
            if slots != (0..state.num_slots() as u32).collect::<Vec<_>>() {
                return Err(format!("state slots are not each held once: {slots:?}"));
            }
        }
        Ok(())
    }
}
