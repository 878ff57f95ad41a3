//! The host side of the GPU attention kernels (`cuda/paged_attention.cu`): how a batch is cut
//! into blocks of work and how the keys are split. Free of any GPU API, so the CPU tests cover
//! it; the CUDA module uploads what it returns.
// Only the `cuda` feature calls into this; its tests run everywhere.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use crate::{KernelError, PagedLayout, SequenceAttention};

/// Query rows one block scores against each K/V tile (`ROWS` in the .cu file).
pub(crate) const BLOCK_ROWS: usize = 16;
/// Keys per shared-memory tile (`KEYS` in the .cu file); split lengths are multiples of it.
pub(crate) const TILE_KEYS: usize = 32;
/// Fewest keys a split of the context gets: below this, merging costs more than it saves.
pub(crate) const MIN_SPLIT_KEYS: usize = 128;

/// The batch as the kernels read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuPlan {
    /// 4 words per sequence: query_start, query_len, context_len, offset of its page table.
    pub seq_words: Vec<u32>,
    /// Every sequence's pages for positions `0..context_len`, back to back.
    pub page_words: Vec<u32>,
    /// 3 words per tile: sequence, first new token, tokens (tokens x group <= BLOCK_ROWS).
    pub tile_words: Vec<u32>,
    /// Keys per split (a multiple of TILE_KEYS).
    pub partition: usize,
    /// Splits of the longest context (1: no merge pass).
    pub num_splits: usize,
}

impl GpuPlan {
    /// Cuts the (validated) batch into tiles of one sequence's tokens x one GQA group, and splits
    /// the keys when tiles x KV heads fall short of `target_blocks` (few sequences decoding over
    /// long contexts).
    pub fn new(
        layout: &PagedLayout,
        num_heads: usize,
        seqs: &[SequenceAttention],
        target_blocks: usize,
    ) -> Result<Self, KernelError> {
        let group = num_heads / layout.num_kv_heads.max(1);
        if group == 0 || group > BLOCK_ROWS {
            return Err(KernelError::Device(format!(
                "{group} query heads per KV head; the GPU kernel takes 1 to {BLOCK_ROWS}"
            )));
        }
        let words = |n: usize, what: &str| {
            u32::try_from(n)
                .map_err(|_| KernelError::Device(format!("{what} {n} does not fit the kernel's 32-bit indices")))
        };
        let tokens_per_tile = BLOCK_ROWS / group;
        let (mut seq_words, mut page_words, mut tile_words) = (Vec::new(), Vec::new(), Vec::new());
        let mut longest = 0;
        for (i, s) in seqs.iter().enumerate() {
            let pages = s.context_len.div_ceil(layout.page_size);
            seq_words.extend([
                words(s.query_start, "row")?,
                words(s.query_len, "query length")?,
                words(s.context_len, "context length")?,
                words(page_words.len(), "page table offset")?,
            ]);
            page_words.extend_from_slice(&s.page_table[..pages]);
            for first in (0..s.query_len).step_by(tokens_per_tile) {
                let n = tokens_per_tile.min(s.query_len - first);
                tile_words.extend([i as u32, first as u32, n as u32]);
            }
            longest = longest.max(s.context_len);
        }
        let blocks = tile_words.len() / 3 * layout.num_kv_heads;
        let mut num_splits = 1;
        let mut partition = longest.max(1).next_multiple_of(TILE_KEYS);
        if blocks > 0 && blocks < target_blocks && longest > MIN_SPLIT_KEYS {
            let wanted = target_blocks.div_ceil(blocks).min(longest / MIN_SPLIT_KEYS).max(1);
            partition = longest.div_ceil(wanted).next_multiple_of(TILE_KEYS);
            num_splits = longest.div_ceil(partition);
        }
        Ok(GpuPlan { seq_words, page_words, tile_words, partition, num_splits })
    }

    /// Tiles in the plan (the grid's x).
    pub fn num_tiles(&self) -> usize {
        self.tile_words.len() / 3
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn batch(shapes: &[(usize, usize)], page_size: usize) -> (PagedLayout, Vec<Vec<u32>>) {
        let pages: usize = shapes.iter().map(|s| s.1.div_ceil(page_size)).sum();
        let layout = PagedLayout { num_kv_heads: 2, head_dim: 64, page_size, num_pages: pages + 1 };
        let mut next = pages as u32;
        let tables = shapes
            .iter()
            .map(|s| {
                (0..s.1.div_ceil(page_size))
                    .map(|_| {
                        next -= 1;
                        next
                    })
                    .collect()
            })
            .collect();
        (layout, tables)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every (sequence, new token) lands in exactly one tile, tiles fit a block, the splits
        /// cover every key of the longest context exactly once, and page tables are laid out
        /// back to back.
        #[test]
        fn tiles_and_splits_cover_the_batch(
            shapes in proptest::collection::vec((1usize..70, 0usize..3000), 1..6),
            group in 1usize..=16,
            page_size in prop::sample::select(vec![1usize, 5, 16]),
            target in 1usize..2000,
        ) {
            let shapes: Vec<(usize, usize)> = shapes.iter().map(|&(q, extra)| (q, q + extra)).collect();
            let (layout, tables) = batch(&shapes, page_size);
            let mut start = 0;
            let seqs: Vec<SequenceAttention> = shapes.iter().zip(&tables).map(|(&(q, ctx), t)| {
                let s = SequenceAttention { query_start: start, query_len: q, context_len: ctx, page_table: t };
                start += q;
                s
            }).collect();
            let plan = GpuPlan::new(&layout, group * layout.num_kv_heads, &seqs, target).unwrap();
            let mut seen: Vec<Vec<u32>> = shapes.iter().map(|s| vec![0; s.0]).collect();
            for t in plan.tile_words.chunks(3) {
                let (seq, first, n) = (t[0] as usize, t[1] as usize, t[2] as usize);
                prop_assert!(n >= 1 && n * group <= BLOCK_ROWS);
                for c in &mut seen[seq][first..first + n] { *c += 1; }
            }
            prop_assert!(seen.iter().flatten().all(|&c| c == 1));
            let longest = shapes.iter().map(|s| s.1).max().unwrap();
            prop_assert_eq!(plan.partition % TILE_KEYS, 0);
            prop_assert!(plan.partition * plan.num_splits >= longest);
            prop_assert!((plan.num_splits - 1) * plan.partition < longest);
            if plan.num_splits > 1 {
                prop_assert!(plan.num_tiles() * layout.num_kv_heads < target);
                prop_assert!(plan.partition >= MIN_SPLIT_KEYS);
            }
            for (i, s) in seqs.iter().enumerate() {
                let w = &plan.seq_words[4 * i..4 * i + 4];
                prop_assert_eq!(w[..3].to_vec(), vec![s.query_start as u32, s.query_len as u32, s.context_len as u32]);
                let pages = s.context_len.div_ceil(page_size);
                let off = w[3] as usize;
                prop_assert_eq!(&plan.page_words[off..off + pages], &s.page_table[..pages]);
            }
        }
    }

    #[test]
    fn a_lone_long_decode_is_split_and_a_big_batch_is_not() {
        let (layout, tables) = batch(&[(1, 6000)], 16);
        let seq = [SequenceAttention { query_start: 0, query_len: 1, context_len: 6000, page_table: &tables[0] }];
        let plan = GpuPlan::new(&layout, 8, &seq, 528).unwrap();
        assert!(plan.num_splits > 1 && plan.partition >= MIN_SPLIT_KEYS, "{plan:?}");
        let plan = GpuPlan::new(&layout, 8, &seq, 2).unwrap();
        assert_eq!(plan.num_splits, 1);
        assert!(GpuPlan::new(&layout, 2 * 17, &seq, 2).is_err(), "17 query heads per KV head");
    }
}
