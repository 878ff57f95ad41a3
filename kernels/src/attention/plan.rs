//! How one [`paged_attention`](crate::paged_attention) call is cut into tasks.

use super::{CHUNK, MAX_ROWS, SequenceAttention};

/// How the batch is cut into tasks: a task is one sequence's block of up to
/// `tokens` query tokens times up to `heads` query heads of one GQA group
/// (at most [`MAX_ROWS`] rows), so those heads share every K/V load; with
/// `split`, a task covers one [`CHUNK`] of the block's context instead of all
/// of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// Query heads per task (within one kv head's group).
    pub heads: usize,
    /// Tasks per kv head's group: `ceil(group / heads)`.
    pub head_chunks: usize,
    /// Query tokens per task.
    pub tokens: usize,
    /// Whether each task covers one chunk of context (its rows' partial
    /// softmax states are merged afterwards) rather than all of it.
    pub split: bool,
}

impl Plan {
    /// Largest tasks that still give every thread a few (`2 * threads`): a
    /// whole GQA group per task (capped at [`MAX_ROWS`] rows) over the whole
    /// context; if that is too few tasks, one task per chunk of context
    /// (long contexts: decode), else halving the heads per task (which makes
    /// tasks re-read K/V, but short contexts have nothing else to split).
    /// Every row's arithmetic is the same under every plan, so the plan
    /// never changes results.
    pub fn new(num_kv_heads: usize, group: usize, seqs: &[SequenceAttention], threads: usize) -> Self {
        let make = |heads: usize, split: bool| Plan {
            heads,
            head_chunks: group.div_ceil(heads),
            tokens: (MAX_ROWS / heads).max(1),
            split,
        };
        let want = 2 * threads;
        let whole = make(group.min(MAX_ROWS), false);
        let whole_tasks = whole.tasks(num_kv_heads, seqs);
        if whole_tasks >= want {
            return whole;
        }
        let split = Plan { split: true, ..whole };
        let split_tasks = split.tasks(num_kv_heads, seqs);
        // Contexts of one chunk gain nothing from splitting.
        let split_helps = split_tasks > whole_tasks;
        if split_helps && split_tasks >= want {
            return split;
        }
        let mut plan = whole;
        while plan.heads > 1 && plan.tasks(num_kv_heads, seqs) < want {
            plan = make(plan.heads.div_ceil(2), false);
        }
        // On a tie, splitting the context wins: halved heads re-read K/V.
        let plan = if split_helps && split_tasks >= plan.tasks(num_kv_heads, seqs) { split } else { plan };
        debug_assert!(plan.heads * plan.tokens <= MAX_ROWS.max(plan.heads));
        plan
    }

    /// Token blocks of a sequence.
    pub fn blocks(&self, seq: &SequenceAttention) -> usize {
        seq.query_len.div_ceil(self.tokens)
    }

    /// Chunks of context that block `block` of `seq` attends to: up to its
    /// last token's position.
    pub fn chunks(&self, seq: &SequenceAttention, block: usize) -> usize {
        let end = seq.context_len - seq.query_len + ((block + 1) * self.tokens).min(seq.query_len);
        end.div_ceil(CHUNK)
    }

    /// Tasks of the whole batch under this plan.
    pub fn tasks(&self, num_kv_heads: usize, seqs: &[SequenceAttention]) -> usize {
        let units = num_kv_heads * self.head_chunks;
        let per_seq = |seq: &SequenceAttention| {
            if self.split { (0..self.blocks(seq)).map(|b| self.chunks(seq, b)).sum() } else { self.blocks(seq) }
        };
        seqs.iter().map(per_seq).fold(0usize, |a, b| a.saturating_add(b)).saturating_mul(units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(query_len: usize, context_len: usize) -> SequenceAttention<'static> {
        SequenceAttention { query_start: 0, query_len, context_len, page_table: &[] }
    }

    #[test]
    fn decode_over_a_long_context_splits_the_context() {
        // SmolLM2: 3 kv heads, groups of 3, 2 threads.
        let plan = Plan::new(3, 3, &[seq(1, 2048)], 2);
        assert_eq!((plan.heads, plan.split), (3, true));
        assert_eq!(plan.tasks(3, &[seq(1, 2048)]), 3 * 2048 / CHUNK);
        // A short context has no chunks to split: heads are halved instead.
        let plan = Plan::new(3, 3, &[seq(1, 100)], 2);
        assert_eq!((plan.heads, plan.split), (2, false));
        // Enough work without splitting.
        let plan = Plan::new(8, 2, &[seq(1, 2048)], 2);
        assert_eq!((plan.heads, plan.split), (2, false));
        let plan = Plan::new(3, 3, &[seq(512, 512)], 2);
        assert!(!plan.split);
    }

    #[test]
    fn chunks_follow_each_blocks_last_position() {
        let plan = Plan { heads: 3, head_chunks: 1, tokens: 16, split: true };
        let s = seq(40, CHUNK + 30);
        // Block 0's last token is at CHUNK - 10 + 15.
        assert_eq!(plan.chunks(&s, 0), 2);
        assert_eq!(plan.chunks(&seq(1, CHUNK), 0), 1);
        assert_eq!(plan.chunks(&seq(1, CHUNK + 1), 0), 2);
    }
}
