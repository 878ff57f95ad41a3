//! A running or waiting request inside the engine.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::radix::NodeId;
use super::request::{EngineEvent, GenerateRequest};
use super::sampler::Sampler;

/// One request's state on the engine thread.
#[derive(Debug)]
pub(crate) struct Sequence {
    /// Prompt followed by the generated tokens.
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: usize,
    /// Leading tokens whose K/V are in `pages`.
    pub(crate) computed: usize,
    /// Page table: the matched cached prefix's pages first (owned by the tree), then ours.
    pub(crate) pages: Vec<u32>,
    /// The locked tree node of the matched prefix.
    pub(crate) node: Option<NodeId>,
    pub(crate) cached_tokens: usize,
    pub(crate) sampler: Sampler,
    pub(crate) request: GenerateRequest,
    pub(crate) events: UnboundedSender<EngineEvent>,
    pub(crate) arrived: Instant,
    pub(crate) admitted: Option<Instant>,
    pub(crate) first_token: Option<Instant>,
}

impl Sequence {
    pub(crate) fn new(request: GenerateRequest, events: UnboundedSender<EngineEvent>) -> Self {
        let sampler = Sampler::new(request.sampling.clone(), &request.prompt);
        Sequence {
            tokens: request.prompt.clone(),
            prompt_len: request.prompt.len(),
            computed: 0,
            pages: Vec::new(),
            node: None,
            cached_tokens: 0,
            sampler,
            request,
            events,
            arrived: Instant::now(),
            admitted: None,
            first_token: None,
        }
    }

    /// Tokens generated so far.
    pub(crate) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// The client is gone (its receiver was dropped).
    pub(crate) fn abandoned(&self) -> bool {
        self.events.is_closed()
    }
}
