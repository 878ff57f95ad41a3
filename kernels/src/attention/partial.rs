//! Softmax states of one query row over separate chunks of its context, and
//! their merge.
//!
//! A row's attention is computed chunk by chunk ([`CHUNK`](super::CHUNK)
//! positions each, from position 0): an online softmax within a chunk gives
//! a partial state (max, sum, unnormalized accumulator), and the partial
//! states are folded in chunk order with [`merge_partial`]. Whether one task
//! walks all chunks and folds as it goes, or one task per chunk stores its
//! partial state ([`PartialBuf`]) for a later fold, every row goes through
//! the same operations, so splitting a long context across threads does not
//! change results.

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    /// The caller's partial-state buffer, reused across calls. Taken out of
    /// the cell while in use, so a nested call (a rayon worker that steals
    /// another attention call while waiting) gets a fresh one instead of a
    /// double borrow.
    static PARTIALS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// Per-sequence offsets into [`PARTIALS`], reused the same way.
    static OFFSETS: Cell<Vec<usize>> = const { Cell::new(Vec::new()) };
}

/// Runs `f` with this thread's reusable buffers, resized to `floats` and
/// `offsets` elements (contents unspecified), and puts them back after.
pub(super) fn with_buffers<R>(floats: usize, offsets: usize, f: impl FnOnce(&mut [f32], &mut [usize]) -> R) -> R {
    let mut buf = PARTIALS.take();
    let mut offs = OFFSETS.take();
    buf.resize(floats, 0.0);
    offs.resize(offsets, 0);
    let result = f(&mut buf, &mut offs);
    PARTIALS.set(buf);
    OFFSETS.set(offs);
    result
}

/// Folds a chunk's partial state (`max`, `sum`, `acc`) into a row's running
/// state, in place. A running state whose max is still `-inf` (none yet:
/// before chunk 0, which every row sees) takes the chunk's state as it is.
#[inline(always)]
pub(super) fn merge_partial(
    run_max: &mut f32,
    run_sum: &mut f32,
    run_acc: &mut [f32],
    max: f32,
    sum: f32,
    acc: &[f32],
) {
    debug_assert_eq!(run_acc.len(), acc.len());
    if *run_max == f32::NEG_INFINITY {
        *run_max = max;
        *run_sum = sum;
        run_acc.copy_from_slice(acc);
        return;
    }
    if max == f32::NEG_INFINITY {
        // The chunk held no weight (only with non-finite inputs).
        return;
    }
    let new_max = run_max.max(max);
    let (a, b) = ((*run_max - new_max).exp(), (max - new_max).exp());
    *run_sum = *run_sum * a + sum * b;
    for (r, x) in run_acc.iter_mut().zip(acc) {
        *r = *r * a + x * b;
    }
    *run_max = new_max;
}

/// Turns a row's merged accumulator into its output, in place: `acc / sum`.
#[inline(always)]
pub(super) fn finish_row(row: &mut [f32], sum: f32) {
    // Every row sees at least position 0, so `sum > 0` unless the inputs
    // hold non-finite values (then so does the output).
    let inv = 1.0 / sum;
    for o in row.iter_mut() {
        // `+ 0.0` turns -0 into +0: adding a masked position's zero weight
        // can flip the sign of a zero accumulator, and how many such
        // positions a row meets depends on its task, so this keeps results
        // plan-independent.
        *o = *o * inv + 0.0;
    }
}

/// The partial-state buffer shared by the tasks of a split call: slot
/// `(offset of the sequence + (token * num_heads + head) * chunks + chunk)`
/// holds `[max, sum, acc[head_dim]]`, and each task writes only its own
/// (token, head, chunk) slots.
pub(super) struct PartialBuf<'a> {
    ptr: *mut f32,
    len: usize,
    /// Floats per slot: `head_dim + 2`.
    pub slot: usize,
    _buf: PhantomData<&'a mut [f32]>,
}

// SAFETY: only used to hand out disjoint slots of one `&mut [f32]` to tasks
// on other threads (see `PartialBuf::slot_mut`).
unsafe impl Send for PartialBuf<'_> {}
// SAFETY: as above.
unsafe impl Sync for PartialBuf<'_> {}

impl<'a> PartialBuf<'a> {
    /// Takes over `buf` (slots of `head_dim + 2` floats) for the tasks.
    pub fn new(buf: &'a mut [f32], head_dim: usize) -> Self {
        Self { ptr: buf.as_mut_ptr(), len: buf.len(), slot: head_dim + 2, _buf: PhantomData }
    }

    /// Slot `index`, mutably.
    ///
    /// # Safety
    /// No two live slices returned by this function may overlap: each
    /// (sequence, token, head, chunk) belongs to one task, and the merge pass
    /// runs after every task has finished.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot_mut(&self, index: usize) -> &mut [f32] {
        let start = index * self.slot;
        assert!(start <= self.len && self.slot <= self.len - start);
        // SAFETY: in bounds (asserted); disjointness is the caller's duty.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), self.slot) }
    }

    /// Slot `index`, to read.
    ///
    /// # Safety
    /// No slice from [`slot_mut`](Self::slot_mut) of this slot may be live.
    pub unsafe fn slot(&self, index: usize) -> &[f32] {
        let start = index * self.slot;
        assert!(start <= self.len && self.slot <= self.len - start);
        // SAFETY: in bounds (asserted); no writer is live (caller's duty).
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), self.slot) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Merging the partial states of two halves equals one softmax over the
    /// whole (to rounding).
    #[test]
    fn merged_halves_equal_the_whole() {
        let scores = [0.5f32, -1.0, 2.0, 0.25, 3.0, -2.0];
        let values = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let partial = |s: &[f32], v: &[f32]| {
            let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
            (m, w.iter().sum::<f32>(), [w.iter().zip(v).map(|(w, v)| w * v).sum::<f32>()])
        };
        let (m0, s0, a0) = partial(&scores[..3], &values[..3]);
        let (m1, s1, a1) = partial(&scores[3..], &values[3..]);
        let (mut m, mut s, mut a) = (f32::NEG_INFINITY, 0.0, [0.0]);
        merge_partial(&mut m, &mut s, &mut a, m0, s0, &a0);
        merge_partial(&mut m, &mut s, &mut a, m1, s1, &a1);
        let (wm, ws, wa) = partial(&scores, &values);
        assert_eq!(m, wm);
        assert!((a[0] / s - wa[0] / ws).abs() < 1e-6);
        // A chunk without weight leaves the state alone.
        merge_partial(&mut m, &mut s, &mut a, f32::NEG_INFINITY, 0.0, &[0.0]);
        assert_eq!(m, wm);
    }
}
