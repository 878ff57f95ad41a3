//! Writing new K/V rows into the paged pool.

use crate::{KernelError, KvElement, PagedLayout};

/// Writes new K and V rows (f32, `[n_rows, num_kv_heads, head_dim]`) into the
/// slots given per row (`slots.len() == n_rows`; a slot id is
/// `page * page_size + offset`, see [`PagedLayout::slot`]), rounding to `T`.
///
/// Everything is validated before the first write, so on `Err` neither cache
/// is modified. If a slot appears twice, the later row wins.
pub fn write_kv<T: KvElement>(
    layout: &PagedLayout,
    k_new: &[f32],
    v_new: &[f32],
    slots: &[u32],
    k_cache: &mut [T],
    v_cache: &mut [T],
) -> Result<(), KernelError> {
    layout.validate()?;
    let slot_len = layout.slot_len();
    let num_slots = layout.num_slots();
    let layer_len = layout.layer_len();
    let expected = slots.len().checked_mul(slot_len).ok_or(KernelError::LengthMismatch {
        what: "slots",
        expected: usize::MAX,
        actual: slots.len(),
    })?;
    check_len("k_new", k_new.len(), expected)?;
    check_len("v_new", v_new.len(), expected)?;
    check_len("k_cache", k_cache.len(), layer_len)?;
    check_len("v_cache", v_cache.len(), layer_len)?;
    if let Some((row, &slot)) = slots.iter().enumerate().find(|&(_, &s)| s as usize >= num_slots) {
        return Err(KernelError::SlotOutOfRange { row, slot, num_slots });
    }

    for ((&slot, k), v) in slots.iter().zip(k_new.chunks_exact(slot_len)).zip(v_new.chunks_exact(slot_len)) {
        let base = slot as usize * slot_len;
        T::slice_from_f32(k, &mut k_cache[base..base + slot_len]);
        T::slice_from_f32(v, &mut v_cache[base..base + slot_len]);
    }
    Ok(())
}

/// `Err(LengthMismatch)` unless `actual == expected`.
pub(crate) fn check_len(what: &'static str, actual: usize, expected: usize) -> Result<(), KernelError> {
    if actual == expected { Ok(()) } else { Err(KernelError::LengthMismatch { what, expected, actual }) }
}
