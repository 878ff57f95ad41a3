//! Cutting a running sequence back to an earlier length. The sequence's K/V and recurrent state
//! are left as a fresh request of the shorter prompt would find them after its placement: every
//! token but the last computed where the cache can say so, the rest to prefill. (Speculative
//! decoding needs none of this: its drafts never enter the sequence, see `engine/draft.rs`.)

use super::RequestCache;
use crate::engine::sequence::Sequence;
use crate::engine::stop::StopText;

impl RequestCache {
    /// Cuts `seq` to its first `len` tokens. The K/V of all but the last token are kept (that
    /// one is computed again, for the logits of what follows) unless they lie in a page the
    /// sequence shares with the tree; pages past `len` go back. A hybrid model's state is that
    /// of the deepest snapshot at or before that point the sequence holds or its locked prefix
    /// has, and the tokens after it are computed again. `text` is the sequence's stop text
    /// started afresh, replayed over the tokens kept. On an error nothing changed.
    pub(crate) fn truncate(&mut self, seq: &mut Sequence, len: usize, text: StopText) -> Result<(), String> {
        seq.check_truncate(len)?;
        let (view, lease) = seq.cache_parts();
        let mut keep = lease.computed.min(len - 1);
        // A hybrid model's state is known only where it was saved: the deepest snapshot there.
        let rewind = match self.states.as_ref() {
            Some(states) if keep < lease.computed => Some(states.deepest_snapshot(view, lease, keep, &mut self.prefix)),
            _ => None,
        };
        if let Some(snapshot) = rewind {
            keep = snapshot.map_or(0, |(at, _)| at);
        }
        // Pages before the state: when they cannot be had, nothing has changed. The snapshot
        // stays put meanwhile: held by the sequence, or on the prefix it keeps locked.
        keep = self
            .prefix
            .truncate(view, lease, keep, len)
            .ok_or_else(|| format!("no free KV page to truncate the sequence to {len} tokens; raise --kv-cache"))?;
        if let (Some(snapshot), Some(states)) = (rewind, self.states.as_mut()) {
            debug_assert_eq!(keep, snapshot.map_or(0, |(at, _)| at), "snapshots lie on page boundaries");
            states.resume(lease, snapshot, &mut self.prefix);
        }
        lease.computed = keep;
        lease.cached_tokens = lease.cached_tokens.min(keep);
        lease.kv_matched = lease.kv_matched.min(keep);
        lease.snapshot_points.retain(|&point| point > keep && point < len);
        seq.truncate(len, text).expect("checked above");
        Ok(())
    }
}
