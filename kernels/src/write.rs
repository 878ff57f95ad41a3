//! Writing new K/V rows into the paged pool.

use crate::{KernelError, KvElement, PagedLayout, hadamard_rotate, k_rotation_block, v_rotation_block};

/// Writes new K and V rows (f32, `[n_rows, num_kv_heads, head_dim]`) into the
/// slots given per row (`slots.len() == n_rows`; a slot id is
/// `page * page_size + offset`, see [`PagedLayout::slot`]), rounding to `K` and `V`
/// (quantizing each head's row block by block for the quantized types, after rotating it into
/// the Hadamard basis, see [`KvElement::ROTATED`]; `head_dim` must then be a multiple of their
/// block).
///
/// Everything is validated before the first write, so on `Err` neither cache
/// is modified. If a slot appears twice, the later row wins.
pub fn write_kv<K: KvElement, V: KvElement>(
    layout: &PagedLayout,
    k_new: &[f32],
    v_new: &[f32],
    slots: &[u32],
    k_cache: &mut [K],
    v_cache: &mut [V],
) -> Result<(), KernelError> {
    layout.validate()?;
    let slot_len = layout.slot_len();
    let num_slots = layout.num_slots();
    let expected = slots.len().checked_mul(slot_len).ok_or(KernelError::LengthMismatch {
        what: "slots",
        expected: usize::MAX,
        actual: slots.len(),
    })?;
    check_len("k_new", k_new.len(), expected)?;
    check_len("v_new", v_new.len(), expected)?;
    check_units::<K>("k_cache", layout, k_cache.len())?;
    check_units::<V>("v_cache", layout, v_cache.len())?;
    if let Some((row, &slot)) = slots.iter().enumerate().find(|&(_, &s)| s as usize >= num_slots) {
        return Err(KernelError::SlotOutOfRange { row, slot, num_slots });
    }

    let mut rotated = vec![0.0f32; if K::ROTATED || V::ROTATED { slot_len } else { 0 }];
    for ((&slot, k), v) in slots.iter().zip(k_new.chunks_exact(slot_len)).zip(v_new.chunks_exact(slot_len)) {
        let base = slot as usize * slot_len;
        store::<K>(
            k,
            k_rotation_block(layout.head_dim),
            &mut rotated,
            &mut k_cache[base / K::VALUES..(base + slot_len) / K::VALUES],
        );
        store::<V>(
            v,
            v_rotation_block(layout.head_dim),
            &mut rotated,
            &mut v_cache[base / V::VALUES..(base + slot_len) / V::VALUES],
        );
    }
    Ok(())
}

/// Stores one slot's row of heads as `T` keeps it: rotated first by Hadamard blocks of `block`
/// values (in `scratch`, a row long when `T` rotates) for the types stored in that basis.
fn store<T: KvElement>(row: &[f32], block: usize, scratch: &mut [f32], units: &mut [T]) {
    if T::ROTATED {
        scratch.copy_from_slice(row);
        hadamard_rotate(scratch, block);
        T::slice_from_f32(scratch, units);
    } else {
        T::slice_from_f32(row, units);
    }
}

/// Checks that one layer's K (or V) storage of `T` has the layout's units: a head's row must be
/// a whole number of units (so a quantized block never spans two heads), and `units` must be
/// [`PagedLayout::layer_len`] values' worth.
pub(crate) fn check_units<T: KvElement>(
    what: &'static str,
    layout: &PagedLayout,
    units: usize,
) -> Result<(), KernelError> {
    if !layout.head_dim.is_multiple_of(T::VALUES) {
        return Err(KernelError::HeadNotWholeBlocks { head_dim: layout.head_dim, block: T::VALUES });
    }
    check_len(what, units, layout.layer_len() / T::VALUES)
}

/// `Err(LengthMismatch)` unless `actual == expected`.
pub(crate) fn check_len(what: &'static str, actual: usize, expected: usize) -> Result<(), KernelError> {
    if actual == expected { Ok(()) } else { Err(KernelError::LengthMismatch { what, expected, actual }) }
}
