//! The scheduler and step loop: admission, batching of decode tokens and prefill chunks, one
//! forward per step, sampling, and returning pages to the tree or the free list.
//!
//! Page ownership (DESIGN.md §2 invariant 1): every page is free, in the tree, or private to
//! exactly one running sequence. A sequence's page table starts with the pages of its matched
//! prefix (the tree's; locked while it runs) and continues with its own. Matches end on a page
//! boundary and new tokens start there, so nobody writes into a page the tree holds.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use radix_models::{ForwardBatch, KvPool, Model};
use tokio::sync::mpsc::UnboundedSender;

use super::cache_report::{CacheReport, RecentPrefix, RecentSequences};
use super::metrics::EngineMetrics;
use super::pages::PageAllocator;
use super::radix::RadixCache;
use super::request::{EngineEvent, FinishReason, GenerateRequest, Timings, TokenLogprobs};
use super::sequence::Sequence;

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

/// A waiting request older than this is admitted before better-cached newer ones.
const AGING: Duration = Duration::from_secs(2);

/// The engine's state; lives on the engine thread.
pub struct EngineCore {
    model: Model,
    pool: KvPool,
    tree: RadixCache,
    alloc: PageAllocator,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    config: EngineConfig,
    /// Recently computed sequences, to explain cache misses.
    recent: RecentSequences,
    metrics: EngineMetrics,
}

/// How many computed sequences are remembered to explain cache misses: enough for a few
/// concurrent agent sessions with their subagents.
const RECENT_SEQUENCES: usize = 32;

impl EngineCore {
    /// An engine over `model` with the given KV pool.
    pub fn new(model: Model, pool: KvPool, config: EngineConfig) -> Self {
        let page_size = pool.page_size();
        let num_pages = pool.num_pages();
        EngineCore {
            model,
            pool,
            tree: RadixCache::new(page_size),
            alloc: PageAllocator::new(num_pages),
            waiting: VecDeque::new(),
            running: Vec::new(),
            config,
            recent: RecentSequences::new(RECENT_SEQUENCES),
            metrics: EngineMetrics::default(),
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
        self.waiting.push_back(Sequence::new(request, events));
    }

    /// Nothing to do.
    pub fn idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Current counts.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            pages_total: self.alloc.num_pages(),
            pages_free: self.alloc.free_pages(),
            pages_cached: self.tree.cached_pages(),
            page_size: self.pool.page_size(),
        }
    }

    /// Admits what fits, runs one forward over all running sequences, samples, and finishes
    /// what is done.
    pub fn step(&mut self) {
        self.drop_abandoned();
        self.admit();
        if self.running.is_empty() {
            return;
        }
        self.grow_decode_pages();
        let (batch, members) = self.build_batch();
        if batch.tokens.is_empty() {
            return;
        }
        let logits = match self.model.forward(&batch, &mut self.pool) {
            Ok(l) => l,
            Err(e) => {
                let message = format!("model forward failed: {e}");
                for seq in std::mem::take(&mut self.running) {
                    let _ = seq.events.send(EngineEvent::Failed(message.clone()));
                    self.release(seq);
                }
                return;
            }
        };
        let device_argmax = if logits.device().is_cpu() || logits.dim(0).unwrap_or(0) == 0 {
            None
        } else {
            logits.argmax(1).and_then(|ids| ids.to_vec1::<u32>()).ok()
        };
        let mut row = 0;
        let mut done = Vec::new();
        for &(index, end, _) in &members {
            let seq = &self.running[index];
            if seq.computed < seq.prompt_len && end >= seq.prompt_len {
                self.share_prompt(index, end);
            }
        }
        for (index, end, wants_logits) in members {
            let seq = &mut self.running[index];
            seq.computed = end;
            if !wants_logits {
                continue;
            }
            let this_row = row;
            row += 1;
            // Plain greedy rows of logits on a GPU are decided there: one id comes back
            // instead of the vocabulary.
            let greedy_on_device = device_argmax.as_ref().and_then(|ids| ids.get(this_row).copied()).filter(|_| {
                seq.sampler.is_plain_greedy()
                    && seq.request.constraint.is_none()
                    && seq.request.sampling.logprobs.is_none()
            });
            let (token, raw_logits) = match greedy_on_device {
                Some(token) => (token, None),
                None => {
                    let mut logits_row = match logits.get(this_row).and_then(|r| r.to_vec1::<f32>()) {
                        Ok(v) => v,
                        Err(e) => {
                            let _ = seq.events.send(EngineEvent::Failed(format!("cannot read logits: {e}")));
                            done.push((index, None));
                            continue;
                        }
                    };
                    // Logprobs are the model's distribution, before masks and penalties change the row.
                    let raw_logits = seq.request.sampling.logprobs.map(|top| (logits_row.clone(), top));
                    if let Some(constraint) = seq.request.constraint.as_mut()
                        && let Err(e) = constraint.mask_logits(&mut logits_row, &seq.request.stop_tokens)
                    {
                        let _ = seq.events.send(EngineEvent::Failed(e));
                        done.push((index, None));
                        continue;
                    }
                    let token = seq.sampler.sample(&mut logits_row);
                    (token, raw_logits)
                }
            };
            seq.sampler.accept(token);
            seq.first_token.get_or_insert_with(Instant::now);
            if seq.request.stop_tokens.contains(&token) {
                done.push((index, Some(FinishReason::Stop)));
                continue;
            }
            // A complete grammar ends the reply right after its last token.
            let accepted = seq.request.constraint.as_mut().map(|c| c.accept(token).map(|()| c.is_finished()));
            let grammar_done = match accepted {
                Some(Err(e)) => {
                    let _ = seq.events.send(EngineEvent::Failed(e));
                    done.push((index, None));
                    continue;
                }
                Some(Ok(finished)) => finished,
                None => false,
            };
            seq.tokens.push(token);
            if let Some((raw, top)) = raw_logits {
                let _ = seq.events.send(EngineEvent::Logprobs(TokenLogprobs::from_logits(&raw, token, top)));
            }
            if seq.events.send(EngineEvent::Token(token)).is_err() {
                done.push((index, None));
            } else if grammar_done {
                done.push((index, Some(FinishReason::Stop)));
            } else if seq.generated() >= seq.request.max_tokens || seq.tokens.len() >= self.config.max_context {
                done.push((index, Some(FinishReason::Length)));
            }
        }
        // Remove from the back so indices stay valid.
        done.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (index, reason) in done {
            let seq = self.running.swap_remove(index);
            self.finish(seq, reason);
        }
        self.debug_check();
    }

    fn drop_abandoned(&mut self) {
        self.waiting.retain(|s| !s.abandoned());
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].abandoned() {
                let seq = self.running.swap_remove(i);
                self.release(seq);
            } else {
                i += 1;
            }
        }
    }

    /// Admits waiting requests while there is room: the one that has waited too long first,
    /// else the one with the longest cached prefix. A request whose pages cannot be had even
    /// after evicting unused cache stays waiting; running sequences are never disturbed.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_running && !self.waiting.is_empty() {
            let mut candidate = None;
            let mut best_cached = 0;
            for i in 0..self.waiting.len() {
                let seq = &self.waiting[i];
                let (use_cache, overdue) = (seq.request.use_cache, seq.arrived.elapsed() > AGING);
                let head = seq.tokens[..seq.prompt_len - 1].to_vec();
                let cached = self.cached_len(&head, use_cache);
                if self.config.prefix_cache && use_cache && self.shares_a_running_prefill(&head, cached) {
                    continue;
                }
                if i == 0 && overdue {
                    candidate = Some(0);
                    break;
                }
                if candidate.is_none() || cached > best_cached {
                    candidate = Some(i);
                    best_cached = cached;
                }
            }
            let Some(index) = candidate else { break };
            let mut seq = self.waiting.remove(index).expect("index in range");
            if !self.try_place(&mut seq) {
                self.waiting.insert(index, seq);
                break;
            }
            let report = self.cache_report(&seq);
            let _ = seq.events.send(EngineEvent::Started {
                prompt_tokens: seq.prompt_len,
                cached_tokens: seq.cached_tokens,
                report: Box::new(report),
            });
            let now = Instant::now();
            seq.admitted = Some(now);
            self.metrics.requests_admitted += 1;
            self.metrics.prompt_tokens += seq.prompt_len as u64;
            self.metrics.cached_tokens += seq.cached_tokens as u64;
            self.metrics.prefill_tokens += (seq.prompt_len - seq.cached_tokens) as u64;
            self.metrics.queue_time.observe(now.duration_since(seq.arrived));
            self.running.push(seq);
        }
    }

    /// Compares an admitted prompt with the recently computed sequences (DESIGN.md §2: the
    /// previous version of a conversation should be a cached prefix of the next).
    fn cache_report(&mut self, seq: &Sequence) -> CacheReport {
        let prompt = &seq.tokens[..seq.prompt_len];
        let p = self.pool.page_size();
        let previous = self.recent.most_similar(prompt, p);
        let cache_on = self.config.prefix_cache && seq.request.use_cache;
        CacheReport::judge(prompt, seq.cached_tokens, cache_on, p, previous)
    }

    /// Recently computed sequences, most reused first (for `/v1/cache`).
    pub fn recent_prefixes(&self) -> Vec<RecentPrefix> {
        self.recent.by_use()
    }

    /// Counters and histograms since start-up.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// Puts a sequence's just-prefilled prompt into the tree while it keeps running, so that
    /// requests sharing the prompt (subagents, parallel sessions) reuse it instead of computing
    /// it again. Its page table switches to the tree's pages wherever the tree already held the
    /// same tokens, and its lock moves to the end of the prompt.
    fn share_prompt(&mut self, index: usize, computed: usize) {
        if !self.config.prefix_cache || !self.running[index].request.use_cache {
            return;
        }
        let seq = &mut self.running[index];
        let inserted = self.tree.insert(&seq.tokens[..computed], &seq.pages);
        if !inserted.duplicate_pages.is_empty() {
            let tree_pages = self.tree.match_prefix(&seq.tokens[..inserted.present_tokens]).pages;
            seq.pages[..tree_pages.len()].copy_from_slice(&tree_pages);
            self.alloc.release(inserted.duplicate_pages);
        }
        self.tree.lock(inserted.node);
        if let Some(old) = seq.node.replace(inserted.node) {
            self.tree.unlock(old);
        }
    }

    /// Whether a running prefill will soon put more of this prompt into the cache than it holds
    /// now: admitting it then would compute the shared part twice.
    fn shares_a_running_prefill(&self, prompt: &[u32], cached: usize) -> bool {
        let p = self.pool.page_size();
        self.running.iter().any(|r| {
            r.computed < r.prompt_len
                && r.request.use_cache
                && r.tokens[..r.prompt_len].iter().zip(prompt).take_while(|(a, b)| a == b).count() >= cached + p
        })
    }

    fn cached_len(&mut self, tokens: &[u32], use_cache: bool) -> usize {
        if self.config.prefix_cache && use_cache { self.tree.match_prefix(tokens).tokens } else { 0 }
    }

    /// Matches the prompt's cached prefix (all but its last token, whose logits are needed),
    /// locks it, and allocates pages for the rest of the prompt.
    fn try_place(&mut self, seq: &mut Sequence) -> bool {
        let p = self.pool.page_size();
        let (node, cached, mut pages) = if self.config.prefix_cache && seq.request.use_cache {
            let m = self.tree.match_prefix(&seq.tokens[..seq.prompt_len - 1]);
            (Some(m.node), m.tokens, m.pages)
        } else {
            (None, 0, Vec::new())
        };
        if let Some(node) = node {
            self.tree.lock(node);
        }
        let needed = seq.prompt_len.div_ceil(p) - pages.len();
        match self.allocate(needed) {
            Some(own) => pages.extend(own),
            None => {
                if let Some(node) = node {
                    self.tree.unlock(node);
                }
                return false;
            }
        }
        seq.node = node;
        seq.cached_tokens = cached;
        seq.computed = cached;
        seq.pages = pages;
        true
    }

    /// Takes `n` free pages, evicting unlocked cache if needed.
    fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if self.alloc.free_pages() < n {
            let freed = self.tree.evict(n - self.alloc.free_pages());
            self.metrics.evicted_pages += freed.len() as u64;
            self.metrics.evicted_tokens += (freed.len() * self.pool.page_size()) as u64;
            self.alloc.release(freed);
        }
        self.alloc.allocate(n)
    }

    /// Gives each decoding sequence a page for its next token when it crosses a page boundary.
    fn grow_decode_pages(&mut self) {
        let p = self.pool.page_size();
        let mut full = Vec::new();
        for i in 0..self.running.len() {
            let need = self.running[i].tokens.len().div_ceil(p);
            if self.running[i].pages.len() < need {
                match self.allocate(need - self.running[i].pages.len()) {
                    Some(pages) => self.running[i].pages.extend(pages),
                    None => full.push(i),
                }
            }
        }
        for i in full.into_iter().rev() {
            let seq = self.running.swap_remove(i);
            self.finish(seq, Some(FinishReason::Length));
        }
    }

    /// Decode tokens first (one per sequence), then prefill chunks within the token budget.
    /// Returns the batch and, per member, (running index, computed after the step, wants logits).
    fn build_batch(&self) -> (ForwardBatch, Vec<(usize, usize, bool)>) {
        let mut batch = ForwardBatch::default();
        let mut members = Vec::new();
        let mut budget = self.config.batch_tokens.max(1);
        let decoding = |s: &Sequence| s.tokens.len() - s.computed == 1;
        let order = (0..self.running.len())
            .filter(|&i| decoding(&self.running[i]))
            .chain((0..self.running.len()).filter(|&i| !decoding(&self.running[i])));
        for i in order {
            if budget == 0 {
                break;
            }
            let seq = &self.running[i];
            let end = seq.tokens.len().min(seq.computed + budget);
            let wants_logits = end == seq.tokens.len();
            batch.push(&seq.tokens[seq.computed..end], end, seq.pages.clone(), wants_logits);
            budget -= end - seq.computed;
            members.push((i, end, wants_logits));
        }
        (batch, members)
    }

    /// Ends a sequence: tells the client (unless it is gone), then releases its pages.
    fn finish(&mut self, seq: Sequence, reason: Option<FinishReason>) {
        if let Some(reason) = reason {
            let now = Instant::now();
            let admitted = seq.admitted.unwrap_or(seq.arrived);
            let first = seq.first_token.unwrap_or(now);
            let timings = Timings {
                cache_n: seq.cached_tokens,
                prompt_n: seq.prompt_len - seq.cached_tokens,
                prompt_ms: first.duration_since(admitted).as_secs_f64() * 1e3,
                predicted_n: seq.generated(),
                predicted_ms: now.duration_since(first).as_secs_f64() * 1e3,
            };
            if let Some(first) = seq.first_token {
                self.metrics.time_to_first_token.observe(first.duration_since(seq.arrived));
                if seq.generated() > 1 {
                    self.metrics
                        .time_per_output_token
                        .observe(now.duration_since(first) / (seq.generated() as u32 - 1));
                }
            }
            let _ = seq.events.send(EngineEvent::Finished { reason, timings });
        }
        self.release(seq);
    }

    /// Inserts what the sequence computed into the tree (prompt and output, so the next turn
    /// of a conversation hits), frees pages the tree does not take, and unlocks its prefix.
    fn release(&mut self, seq: Sequence) {
        let p = self.pool.page_size();
        self.metrics.generated_tokens += seq.generated() as u64;
        self.recent.record(&seq.tokens[..seq.computed], seq.prompt_len);
        let kept = if self.config.prefix_cache && seq.request.use_cache {
            let inserted = self.tree.insert(&seq.tokens[..seq.computed], &seq.pages);
            self.alloc.release(inserted.duplicate_pages);
            seq.computed / p
        } else {
            // Without the cache, only a matched prefix (none) belongs to the tree.
            0
        };
        self.alloc.release(seq.pages[kept..].iter().copied());
        if let Some(node) = seq.node {
            self.tree.unlock(node);
        }
    }

    /// Drops every cached prefix (nothing may be running).
    pub fn flush_cache(&mut self) {
        let freed = self.tree.evict(usize::MAX);
        self.alloc.release(freed);
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
        self.tree.check_invariants()?;
        let mut owner = vec![0u8; self.alloc.num_pages()];
        let mut mark = |page: u32, what: &str| -> Result<(), String> {
            let slot = owner.get_mut(page as usize).ok_or(format!("page {page} outside the pool"))?;
            *slot += 1;
            if *slot > 1 { Err(format!("page {page} counted twice (last as {what})")) } else { Ok(()) }
        };
        for &page in self.alloc.free_list() {
            mark(page, "free")?;
        }
        let tree_pages = self.tree.pages();
        for &page in &tree_pages {
            mark(page, "cached")?;
        }
        let tree_set: std::collections::HashSet<u32> = tree_pages.into_iter().collect();
        for seq in &self.running {
            for &page in seq.pages.iter().filter(|p| !tree_set.contains(p)) {
                mark(page, "private")?;
            }
        }
        if let Some(page) = owner.iter().position(|&n| n == 0) {
            return Err(format!("page {page} is neither free, cached nor used"));
        }
        if self.running.is_empty() && self.tree.any_locked() {
            return Err("a node is locked while nothing runs".into());
        }
        Ok(())
    }
}
