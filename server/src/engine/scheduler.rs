//! Who runs and what one forward pass computes: admission of waiting requests (aging, longest
//! cached prefix first, waiting for a running prefill that shares the prompt), the batch of
//! decode tokens and prefill chunks, and the pages decoding sequences grow into.

use std::collections::VecDeque;
use std::time::Duration;

use radix_models::ForwardBatch;

use super::cache::{Placement, RequestCache};
use super::sequence::Sequence;

/// A waiting request older than this is admitted before better-cached newer ones.
const AGING: Duration = Duration::from_secs(2);

/// One sequence's part of a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    /// Index into the running sequences.
    pub(crate) index: usize,
    /// Tokens with K/V once the pass is done.
    pub(crate) end: usize,
    /// The pass yields a logits row for it (its last token is computed), in member order.
    pub(crate) wants_logits: bool,
    /// Drafted tokens verified after its last one (speculative decoding): the pass yields a
    /// logits row for each of them too, and the cache learns after the postprocess how many
    /// were accepted.
    pub(crate) drafted: usize,
}

/// The waiting queue and the running set.
#[derive(Debug)]
pub(crate) struct Scheduler {
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    /// Most sequences running at once.
    max_running: usize,
    /// Most tokens in one forward pass.
    batch_tokens: usize,
}

impl Scheduler {
    /// An empty scheduler with these limits.
    pub(crate) fn new(max_running: usize, batch_tokens: usize) -> Self {
        Scheduler { waiting: VecDeque::new(), running: Vec::new(), max_running, batch_tokens: batch_tokens.max(1) }
    }

    /// Queues a request.
    pub(crate) fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Nothing waits and nothing runs.
    pub(crate) fn idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Requests waiting for admission.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The running sequences, in admission order (indices of [`Member`] point here).
    pub(crate) fn running(&self) -> &[Sequence] {
        &self.running
    }

    /// The running sequences, to update after a forward pass.
    pub(crate) fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    /// Takes out every running sequence.
    pub(crate) fn take_running(&mut self) -> Vec<Sequence> {
        std::mem::take(&mut self.running)
    }

    /// Takes out the running sequences at the given indices (any order, no repeats), each with
    /// what came with its index.
    pub(crate) fn remove<T>(&mut self, mut picked: Vec<(usize, T)>) -> Vec<(Sequence, T)> {
        // From the back, so that the indices still to come stay valid.
        picked.sort_unstable_by_key(|&(i, _)| std::cmp::Reverse(i));
        picked.into_iter().map(|(i, with)| (self.running.swap_remove(i), with)).collect()
    }

    fn remove_where(&mut self, mut pick: impl FnMut(&mut Sequence) -> bool) -> Vec<Sequence> {
        let picked = (0..self.running.len()).filter(|&i| pick(&mut self.running[i])).map(|i| (i, ())).collect();
        self.remove(picked).into_iter().map(|(seq, ())| seq).collect()
    }

    /// Forgets waiting requests whose client left and takes out running ones.
    pub(crate) fn take_abandoned(&mut self) -> Vec<Sequence> {
        self.waiting.retain(|s| !s.abandoned());
        self.remove_where(|s| s.abandoned())
    }

    /// Admits waiting requests while there is room: the one that has waited too long first,
    /// else the one with the longest cached prefix. A request whose pages cannot be had even
    /// after evicting unused cache stays waiting; running sequences are never disturbed.
    /// Returns the running indices of the newly admitted, with where their prompts were found.
    pub(crate) fn admit(&mut self, cache: &mut RequestCache) -> Vec<(usize, Placement)> {
        let mut admitted = Vec::new();
        while self.running.len() < self.max_running && !self.waiting.is_empty() {
            let Some(index) = self.candidate(cache) else { break };
            let mut seq = self.waiting.remove(index).expect("index in range");
            let Some(placement) = cache.place(&mut seq) else {
                self.waiting.insert(index, seq);
                break;
            };
            admitted.push((self.running.len(), placement));
            self.running.push(seq);
        }
        admitted
    }

    /// The waiting request to admit next, if any may be.
    fn candidate(&self, cache: &RequestCache) -> Option<usize> {
        let mut candidate = None;
        let mut best_cached = 0;
        for (i, seq) in self.waiting.iter().enumerate() {
            let cached = cache.cached_prompt(seq);
            if cache.serves(seq.request().use_cache) && self.shares_a_running_prefill(seq, cached, cache.page_size()) {
                continue;
            }
            if i == 0 && seq.arrived().elapsed() > AGING {
                return Some(0);
            }
            if candidate.is_none() || cached > best_cached {
                candidate = Some(i);
                best_cached = cached;
            }
        }
        candidate
    }

    /// Whether a running prefill will soon put more of this prompt into the cache than it holds
    /// now: admitting it then would compute the shared part twice.
    fn shares_a_running_prefill(&self, seq: &Sequence, cached: usize, page_size: usize) -> bool {
        let prompt = &seq.tokens()[..seq.prompt_len() - 1];
        self.running.iter().any(|r| {
            r.lease().computed() < r.prompt_len()
                && r.request().use_cache
                && r.request().cache_namespace == seq.request().cache_namespace
                && r.tokens()[..r.prompt_len()].iter().zip(prompt).take_while(|(a, b)| a == b).count()
                    >= cached + page_size
        })
    }

    /// Gives each decoding sequence a page for its next token when it crosses a page boundary;
    /// takes out those the full pool cannot serve.
    pub(crate) fn grow_decode_pages(&mut self, cache: &mut RequestCache) -> Vec<Sequence> {
        self.remove_where(|s| !cache.grow(s))
    }

    /// Drafts tokens for the decoding sequences that speculate, within what the batch's token
    /// budget leaves beside one token per decoding sequence, their `max_tokens`, the context
    /// (`max_context`) and the pages the pool can give for them. Returns the running indices
    /// of those whose multi-token-prediction head should draft, with how many tokens it may
    /// (their pages are reserved).
    pub(crate) fn draft(&mut self, cache: &mut RequestCache, max_context: usize) -> Vec<(usize, usize)> {
        let decoding = self.running.iter().filter(|s| s.decoding()).count();
        let mut budget = self.batch_tokens.saturating_sub(decoding);
        let mut by_head = Vec::new();
        for (index, seq) in self.running.iter_mut().enumerate().filter(|(_, s)| s.decoding()) {
            let limit = budget.min(seq.draft_room(max_context));
            let drafted = seq.propose_draft(limit);
            let wanted = drafted.max(seq.mtp_wanted());
            if wanted > 0 {
                let held = cache.reserve_draft(seq, wanted);
                match drafted {
                    0 if held > 0 => by_head.push((index, held)),
                    0 => {}
                    _ => seq.cut_draft(held),
                }
                budget -= held;
            }
        }
        by_head
    }

    /// Decode tokens first (one per sequence, with its draft to verify), then prefill chunks
    /// within the token budget.
    pub(crate) fn build_batch(&self) -> (ForwardBatch, Vec<Member>) {
        let mut batch = ForwardBatch::default();
        let mut members = Vec::new();
        let mut budget = self.batch_tokens;
        let order = (0..self.running.len())
            .filter(|&i| self.running[i].decoding())
            .chain((0..self.running.len()).filter(|&i| !self.running[i].decoding()));
        for index in order {
            if budget == 0 {
                break;
            }
            let (seq, lease) = (&self.running[index], self.running[index].lease());
            let (tokens, computed) = (seq.tokens(), lease.computed());
            let draft = seq.draft();
            if !draft.is_empty() && draft.len() < budget {
                let span: Vec<u32> = tokens[computed..].iter().chain(draft).copied().collect();
                let end = tokens.len() + draft.len();
                batch.push_verify(&span, end, lease.pages().to_vec(), lease.state_slot());
                budget -= span.len();
                members.push(Member { index, end, wants_logits: true, drafted: draft.len() });
                continue;
            }
            let mut end = tokens.len().min(computed + budget);
            // A chunk ends at the next snapshot point, so the state there can be saved.
            if let Some(point) = lease.next_snapshot_point() {
                end = end.min(point);
            }
            let wants_logits = end == tokens.len();
            batch.push_with_state(
                &tokens[computed..end],
                end,
                lease.pages().to_vec(),
                wants_logits,
                lease.state_slot(),
            );
            budget -= end - computed;
            members.push(Member { index, end, wants_logits, drafted: 0 });
        }
        (batch, members)
    }
}
