//! A running or waiting request inside the engine: what generation needs (its tokens, sampler,
//! constraint, stop text and client), and the cache lease that says where its K/V and state
//! are, which only the cache changes (`cache/lease.rs`).

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::cache::lease::CacheLease;
use super::cache_key::CacheKey;
use super::draft::{Drafter, SpecConfig};
use super::request::{EngineEvent, FinishReason, GenerateRequest, Timings, TokenLogprobs};
use super::sampler::Sampler;
use super::stop::StopText;

/// One request's state on the engine thread. Its fields are written here alone; the cache
/// writes its lease, whose fields are the cache's own.
#[derive(Debug)]
pub(crate) struct Sequence {
    /// Prompt followed by the generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    sampler: Sampler,
    /// The generated text, with stop strings matched in it.
    text: StopText,
    request: GenerateRequest,
    events: UnboundedSender<EngineEvent>,
    arrived: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    lease: CacheLease,
    /// Speculative decoding's drafts, when the server and the request speculate.
    drafter: Option<Drafter>,
}

/// How a running sequence ends; every ending goes through the engine's one finish path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    /// Generation ended and the client hears why.
    Finished(FinishReason),
    /// The client is gone: nobody to tell.
    Abandoned,
    /// The request could not be served.
    Failed(String),
}

/// What the cache reads of a sequence while it changes the sequence's lease: the two borrows
/// of [`Sequence::cache_parts`] are disjoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SequenceView<'a> {
    /// Prompt followed by the generated tokens.
    pub(crate) tokens: &'a [u32],
    /// Tokens of the prompt.
    pub(crate) prompt_len: usize,
    /// The request.
    pub(crate) request: &'a GenerateRequest,
}

impl SequenceView<'_> {
    /// The prefix cache's key for the first `len` tokens.
    pub(crate) fn cache_key(&self, len: usize) -> CacheKey<'_> {
        CacheKey::new(self.request.cache_namespace, &self.tokens[..len])
    }
}

impl Sequence {
    /// A request just arrived, waiting for admission; `text` decodes its output. It drafts
    /// tokens ahead with `spec` when that is on, within the request's own limit.
    pub(crate) fn new(
        request: GenerateRequest,
        events: UnboundedSender<EngineEvent>,
        text: StopText,
        spec: SpecConfig,
    ) -> Self {
        let sampler = Sampler::new(request.sampling.clone(), &request.prompt);
        let spec = SpecConfig { draft_max: request.draft_max.unwrap_or(spec.draft_max).min(spec.draft_max), ..spec };
        let drafter = spec.enabled().then(|| Drafter::new(spec));
        Sequence {
            tokens: request.prompt.clone(),
            prompt_len: request.prompt.len(),
            sampler,
            text,
            request,
            events,
            arrived: Instant::now(),
            admitted: None,
            first_token: None,
            lease: CacheLease::default(),
            drafter,
        }
    }

    /// Prompt followed by the generated tokens.
    pub(crate) fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Tokens of the prompt.
    pub(crate) fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// The request as the API made it.
    pub(crate) fn request(&self) -> &GenerateRequest {
        &self.request
    }

    /// When the request arrived.
    pub(crate) fn arrived(&self) -> Instant {
        self.arrived
    }

    /// When its first token was decided, if it was.
    pub(crate) fn first_token(&self) -> Option<Instant> {
        self.first_token
    }

    /// Where its K/V and recurrent state are.
    pub(crate) fn lease(&self) -> &CacheLease {
        &self.lease
    }

    /// What the cache reads of the sequence.
    pub(crate) fn view(&self) -> SequenceView<'_> {
        SequenceView { tokens: &self.tokens, prompt_len: self.prompt_len, request: &self.request }
    }

    /// The lease to change (only the cache can: the lease's fields and changes are its own) and
    /// what the cache reads of the sequence meanwhile.
    pub(crate) fn cache_parts(&mut self) -> (SequenceView<'_>, &mut CacheLease) {
        let view = SequenceView { tokens: &self.tokens, prompt_len: self.prompt_len, request: &self.request };
        (view, &mut self.lease)
    }

    /// Tokens generated so far.
    pub(crate) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// The client is gone (its receiver was dropped).
    pub(crate) fn abandoned(&self) -> bool {
        self.events.is_closed()
    }

    /// Tells the client; `false` when it is gone.
    pub(crate) fn send(&self, event: EngineEvent) -> bool {
        self.events.send(event).is_ok()
    }

    /// Admitted at `now`: its prefill time counts from here.
    pub(crate) fn admitted_at(&mut self, now: Instant) {
        self.admitted = Some(now);
    }

    /// Ends the text without a stop string: whatever it held back.
    pub(crate) fn finish_text(&mut self) -> String {
        self.text.finish()
    }

    /// Whether its next token is a bare argmax of the logits (greedy, no penalty, no masking
    /// constraint, no log-probabilities): then it can be decided where the logits are.
    pub(crate) fn is_plain_greedy(&self) -> bool {
        // A lazy constraint that masks nothing yet (or never will) leaves the row plain.
        self.sampler.is_plain_greedy()
            && self.request.constraint.as_ref().is_none_or(|c| !c.masking())
            && self.request.sampling.logprobs.is_none()
    }

    /// How many alternatives' log-probabilities it wants with each token, if any.
    pub(crate) fn top_logprobs(&self) -> Option<usize> {
        self.request.sampling.logprobs
    }

    /// Picks its next token from `logits` (masked by its constraint and, with `ignore_eos`, with
    /// the stop tokens left out, then sampled).
    pub(crate) fn sample(&mut self, logits: &mut [f32]) -> Result<u32, String> {
        if let Some(constraint) = self.request.constraint.as_mut() {
            constraint.mask_logits(logits, &self.request.stop_tokens)?;
        }
        if self.request.sampling.ignore_eos {
            for &stop in &self.request.stop_tokens {
                if let Some(logit) = logits.get_mut(stop as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        Ok(self.sampler.sample(logits))
    }

    /// Takes `token` into the sequence and tells the client (with its log-probabilities when
    /// asked for); returns how the sequence ends, if it does, at `max_context` tokens at most.
    pub(crate) fn accept(&mut self, token: u32, logprobs: Option<TokenLogprobs>, max_context: usize) -> Option<Ending> {
        self.sampler.accept(token);
        self.first_token.get_or_insert_with(Instant::now);
        if self.request.stop_tokens.contains(&token) {
            return Some(Ending::Finished(FinishReason::Stop));
        }
        // A complete grammar ends the reply right after its last token.
        let grammar_done = match self.request.constraint.as_mut().map(|c| c.accept(token).map(|()| c.is_finished())) {
            Some(Err(e)) => return Some(Ending::Failed(e)),
            Some(Ok(finished)) => finished,
            None => false,
        };
        self.tokens.push(token);
        if let Some(logprobs) = logprobs {
            let _ = self.events.send(EngineEvent::Logprobs(logprobs));
        }
        let (text, stop_string) = self.text.push(token);
        if self.events.send(EngineEvent::Token { id: token, text }).is_err() {
            Some(Ending::Abandoned)
        } else if let Some(word) = stop_string {
            Some(Ending::Finished(FinishReason::StopString(word)))
        } else if grammar_done {
            Some(Ending::Finished(FinishReason::Stop))
        } else if self.generated() >= self.request.max_tokens || self.tokens.len() >= max_context {
            Some(Ending::Finished(FinishReason::Length))
        } else {
            None
        }
    }

    /// Forgets every token after the first `len` (the generation side of a truncation; the
    /// cache truncates the lease first): the sampler's penalties and the stop text are rebuilt
    /// from what is left, and a cut inside the prompt makes the rest the prompt. What was sent
    /// to the client stays sent; the sampler's random stream is not rewound. A grammar cannot
    /// be rewound: with a constraint, only a cut at the end is allowed.
    pub(crate) fn truncate(&mut self, len: usize, text: StopText) -> Result<(), String> {
        self.check_truncate(len)?;
        self.tokens.truncate(len);
        self.prompt_len = self.prompt_len.min(len);
        let mut sampler = Sampler::new(self.request.sampling.clone(), &self.tokens[..self.prompt_len]);
        self.text = text;
        for &token in &self.tokens[self.prompt_len..] {
            sampler.accept(token);
            self.text.push(token);
        }
        sampler.continue_stream_of(&self.sampler);
        self.sampler = sampler;
        Ok(())
    }

    /// Whether [`Sequence::truncate`] can cut it to `len` tokens.
    pub(crate) fn check_truncate(&self, len: usize) -> Result<(), String> {
        if len == 0 || len > self.tokens.len() {
            return Err(format!("cannot truncate a sequence of {} tokens to {len}", self.tokens.len()));
        }
        if self.request.constraint.is_some() && len < self.tokens.len() {
            return Err("a constrained sequence cannot be truncated: its grammar cannot go back".into());
        }
        Ok(())
    }

    /// Whether it is decoding: every token but the last computed.
    pub(crate) fn decoding(&self) -> bool {
        self.tokens.len() - self.lease.computed() == 1
    }

    /// Drafts at most `limit` tokens to verify after its last one this step (none when it does
    /// not speculate or nothing fits); returns how many.
    pub(crate) fn propose_draft(&mut self, limit: usize) -> usize {
        match self.drafter.as_mut() {
            Some(drafter) if limit > 0 => drafter.propose(&self.tokens, limit).len(),
            _ => 0,
        }
    }

    /// Tokens its multi-token-prediction head should draft this step instead (0: none).
    pub(crate) fn mtp_wanted(&self) -> usize {
        self.drafter.as_ref().map_or(0, Drafter::mtp_wanted)
    }

    /// Takes the multi-token-prediction head's draft for this step.
    pub(crate) fn take_mtp_draft(&mut self, draft: Vec<u32>) {
        if let Some(drafter) = self.drafter.as_mut() {
            drafter.take_mtp_draft(draft);
        }
    }

    /// The tokens drafted for this step (empty: a plain decode step).
    pub(crate) fn draft(&self) -> &[u32] {
        self.drafter.as_ref().map_or(&[], Drafter::draft)
    }

    /// Keeps only the first `len` drafted tokens (the pool had pages for no more).
    pub(crate) fn cut_draft(&mut self, len: usize) {
        if let Some(drafter) = self.drafter.as_mut() {
            drafter.cut(len);
        }
    }

    /// After the verify pass: the first `accepted` drafted tokens were taken.
    pub(crate) fn draft_verified(&mut self, accepted: usize) {
        if let Some(drafter) = self.drafter.as_mut() {
            drafter.verified(accepted);
        }
    }

    /// Most tokens it may still draft: the accepted ones and the token after them must stay
    /// within `max_tokens` and `max_context`.
    pub(crate) fn draft_room(&self, max_context: usize) -> usize {
        let by_tokens = self.request.max_tokens.saturating_sub(self.generated() + 1);
        let by_context = max_context.saturating_sub(self.tokens.len() + 1);
        by_tokens.min(by_context)
    }

    /// Timings in llama.cpp's terms, as of `now`.
    pub(crate) fn timings(&self, now: Instant) -> Timings {
        let admitted = self.admitted.unwrap_or(self.arrived);
        let first = self.first_token.unwrap_or(now);
        let cached = self.lease.cached_tokens();
        Timings {
            cache_n: cached,
            prompt_n: self.prompt_len - cached.min(self.prompt_len),
            prompt_ms: first.duration_since(admitted).as_secs_f64() * 1e3,
            predicted_n: self.generated(),
            predicted_ms: now.duration_since(first).as_secs_f64() * 1e3,
            draft_n: self.drafter.as_ref().map_or(0, |d| d.counts().0),
            draft_n_accepted: self.drafter.as_ref().map_or(0, |d| d.counts().1),
        }
    }
}
