//! Checks of [`paged_attention`](crate::paged_attention)'s inputs, shared
//! with the CUDA path.

use super::SequenceAttention;
use crate::write::{check_len, check_units};
use crate::{KernelError, KvElement, PagedLayout};

/// Checks every shape and bound of [`paged_attention`]'s inputs.
#[allow(clippy::too_many_arguments)]
pub(super) fn validate<K: KvElement, V: KvElement>(
    layout: &PagedLayout,
    num_heads: usize,
    scale: f32,
    q: &[f32],
    k_cache: &[K],
    v_cache: &[V],
    seqs: &[SequenceAttention],
    out: &[f32],
) -> Result<(), KernelError> {
    layout.validate()?;
    if num_heads == 0 || !num_heads.is_multiple_of(layout.num_kv_heads) {
        return Err(KernelError::HeadsNotMultiple { num_heads, num_kv_heads: layout.num_kv_heads });
    }
    if !scale.is_finite() {
        return Err(KernelError::NonFiniteScale(scale));
    }
    let row_len = num_heads
        .checked_mul(layout.head_dim)
        .ok_or(KernelError::InvalidLayout("num_heads * head_dim overflows usize"))?;
    check_units::<K>("k_cache", layout, k_cache.len())?;
    check_units::<V>("v_cache", layout, v_cache.len())?;
    if !q.len().is_multiple_of(row_len) {
        return Err(KernelError::RaggedRows { what: "q", len: q.len(), row_len });
    }
    check_len("out", out.len(), q.len())?;
    validate_sequences(layout, q.len() / row_len, seqs)
}

/// Checks every sequence of a batch of `n_rows` query rows against the pool:
/// non-empty queries inside the batch and disjoint, contexts covered by page
/// tables of in-range pages. Shared by the CPU and CUDA paths.
pub(crate) fn validate_sequences(
    layout: &PagedLayout,
    n_rows: usize,
    seqs: &[SequenceAttention],
) -> Result<(), KernelError> {
    for (i, s) in seqs.iter().enumerate() {
        if s.query_len == 0 {
            return Err(KernelError::EmptyQuery { seq: i });
        }
        if s.context_len < s.query_len {
            return Err(KernelError::ContextShorterThanQuery {
                seq: i,
                context_len: s.context_len,
                query_len: s.query_len,
            });
        }
        match s.query_start.checked_add(s.query_len) {
            Some(end) if end <= n_rows => {}
            _ => {
                return Err(KernelError::QueryRowsOutOfBounds {
                    seq: i,
                    start: s.query_start,
                    len: s.query_len,
                    n_rows,
                });
            }
        }
        let needed = s.context_len.div_ceil(layout.page_size);
        if s.page_table.len() < needed {
            return Err(KernelError::PageTableTooShort {
                seq: i,
                len: s.page_table.len(),
                needed,
                context_len: s.context_len,
            });
        }
        if let Some((index, &page)) =
            s.page_table[..needed].iter().enumerate().find(|&(_, &p)| p as usize >= layout.num_pages)
        {
            return Err(KernelError::PageOutOfRange { seq: i, index, page, num_pages: layout.num_pages });
        }
    }

    // Disjoint query rows: intervals sorted by start must not overlap. The
    // usual batch is already sorted, which needs no allocation.
    let overlap = |a: usize, b: usize| {
        let (x, y) = (&seqs[a], &seqs[b]);
        // Ends were checked above, so this cannot overflow.
        if x.query_start + x.query_len > y.query_start {
            Err(KernelError::QueryRowsOverlap { first: a.min(b), second: a.max(b) })
        } else {
            Ok(())
        }
    };
    if seqs.windows(2).all(|w| w[0].query_start <= w[1].query_start) {
        (1..seqs.len()).try_for_each(|i| overlap(i - 1, i))?;
    } else {
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_unstable_by_key(|&i| seqs[i].query_start);
        order.windows(2).try_for_each(|w| overlap(w[0], w[1]))?;
    }
    Ok(())
}
