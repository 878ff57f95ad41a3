//! A sequence's lease on the cache: its page table, its lock on the tree, its recurrent-state
//! slot and the snapshots it holds. Every field is the cache's to change; the engine reads them
//! through the accessors.

use crate::engine::radix::NodeId;

/// Where one sequence's K/V and recurrent state are while it runs.
#[derive(Debug, Default)]
pub(crate) struct CacheLease {
    /// Leading tokens whose K/V are in `pages` (and, for a hybrid model, whose state is in
    /// `state_slot`).
    pub(super) computed: usize,
    /// Page table: the tree's pages of the locked prefix first, then the sequence's own.
    pub(super) pages: Vec<u32>,
    /// The locked tree node, the end of the prefix whose pages the table shares with the tree.
    pub(super) node: Option<NodeId>,
    /// Tokens of that prefix: the first `locked_tokens / page_size` pages are the tree's.
    pub(super) locked_tokens: usize,
    /// Prompt tokens the cache served (memory and disk) when the sequence was placed.
    pub(super) cached_tokens: usize,
    /// How far the KV alone matched the cache (a hybrid model resumes at `cached_tokens`, the
    /// deepest snapshot, which may be earlier).
    pub(super) kv_matched: usize,
    /// Hybrid models: the state pool slot holding its recurrent state while it runs.
    pub(super) state_slot: Option<u32>,
    /// Hybrid models: prompt positions still to snapshot, descending (the next one last);
    /// prefill chunks end at each.
    pub(super) snapshot_points: Vec<usize>,
    /// Hybrid models: the request's expected points and the prompt's all-but-last token, in
    /// whole pages, ascending: snapshots there are filed as expected.
    pub(super) expected_points: Vec<usize>,
    /// Hybrid models: the system block's line starts in whole pages, ascending, when this
    /// sequence starts a conversation there (its match ended inside the block): snapshots
    /// there are filed as expected, others may branch there (empty otherwise).
    pub(super) branch_expected: Vec<usize>,
    /// Snapshots taken (tokens, slot) and not yet filed in the tree.
    pub(super) snapshots: Vec<(usize, u32)>,
    /// With pages of more than one token: the state at the last page boundary decoding crossed,
    /// so that the end of generation (rarely on a boundary) still leaves a snapshot where its
    /// cached KV ends.
    pub(super) rolling_snapshot: Option<(usize, u32)>,
}

impl CacheLease {
    /// Leading tokens whose K/V (and state) are computed.
    pub(crate) fn computed(&self) -> usize {
        self.computed
    }

    /// The page table the forward pass reads and writes.
    pub(crate) fn pages(&self) -> &[u32] {
        &self.pages
    }

    /// Prompt tokens the cache served when the sequence was placed.
    pub(crate) fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }

    /// How far the prompt's K/V alone matched the cache.
    pub(crate) fn kv_matched(&self) -> usize {
        self.kv_matched
    }

    /// Hybrid models: the recurrent-state slot the forward pass reads and writes.
    pub(crate) fn state_slot(&self) -> Option<u32> {
        self.state_slot
    }

    /// Where the next prefill chunk must end so that the state there can be saved, if past
    /// what is computed.
    pub(crate) fn next_snapshot_point(&self) -> Option<usize> {
        self.snapshot_points.last().copied().filter(|&p| p > self.computed)
    }

    /// The snapshot slots it holds (taken and not yet filed in the tree).
    pub(super) fn held_snapshot_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.snapshots.iter().chain(&self.rolling_snapshot).map(|&(_, slot)| slot)
    }

    /// Whether a snapshot after the first `len` tokens is one a later request is expected to
    /// resume from: an expected point, or past the prompt (the reply's end, where the next turn
    /// goes on when the agent sends the reply back).
    pub(super) fn expects_resume_at(&self, len: usize, prompt_len: usize) -> bool {
        len >= prompt_len || self.expected_points.binary_search(&len).is_ok()
    }
}
