//! Storage element types of the paged KV pool.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::{KvQ4_0, KvQ8_0};

/// A unit of K/V storage: one value of `f32`, [`half::f16`] or [`half::bf16`], or a block of
/// [`VALUES`](Self::VALUES) values quantized together ([`KvQ8_0`](crate::KvQ8_0),
/// [`KvQ4_0`](crate::KvQ4_0)).
///
/// Attention always computes in `f32`; K/V rows are converted on load and rounded (or
/// quantized) on store ([`write_kv`](crate::write_kv)). A head's row is a whole number of
/// units, so a block never spans two heads or two tokens.
pub trait KvElement: Copy + Send + Sync + 'static {
    /// Values one unit holds: 1 for the float types, the block length for the quantized ones.
    const VALUES: usize = 1;

    /// The unit of an empty slot (all values zero).
    const ZERO: Self;

    /// Whether a head's values are stored rotated into the Hadamard basis
    /// ([`hadamard_rotate`](crate::hadamard_rotate) over [`k_rotation_block`](crate::k_rotation_block)
    /// for K, [`v_rotation_block`](crate::v_rotation_block) for V): set for the block-quantized types, whose
    /// blocks would otherwise take their scale from a model's outlier channels. The units then
    /// hold `H x` for the values `x` given to [`write_kv`](crate::write_kv); attention computes
    /// with `x` all the same. [`slice_from_f32`](Self::slice_from_f32) and
    /// [`slice_to_f32`](Self::slice_to_f32) convert units as stored, without rotating.
    const ROTATED: bool = false;

    /// Converts the units `src` into `dst`; `dst.len()` must equal
    /// `src.len() * VALUES`. The same units always give the same bits.
    fn slice_to_f32(src: &[Self], dst: &mut [f32]);

    /// Rounds (or quantizes) `src` into the units `dst`; `src.len()` must equal
    /// `dst.len() * VALUES`. Each unit depends only on its own values.
    fn slice_from_f32(src: &[f32], dst: &mut [Self]);

    /// Borrows `src` as `f32` without copying when `Self` is `f32`, so the
    /// kernels read an `f32` pool in place; `None` for every other type.
    fn as_f32_slice(src: &[Self]) -> Option<&[f32]> {
        let _ = src;
        None
    }

    /// Borrows `src` as [`f16`] when `Self` is `f16`, so the kernels can use
    /// their own inlined conversion; `None` for every other type.
    fn as_f16_slice(src: &[Self]) -> Option<&[f16]> {
        let _ = src;
        None
    }

    /// Borrows `src` as [`bf16`] when `Self` is `bf16`, as
    /// [`as_f16_slice`](Self::as_f16_slice); `None` for every other type.
    fn as_bf16_slice(src: &[Self]) -> Option<&[bf16]> {
        let _ = src;
        None
    }

    /// Borrows `src` as [`KvQ8_0`] blocks when `Self` is `KvQ8_0`, so the kernels read a q8_0
    /// pool in place; `None` for every other type.
    fn as_q8_0_slice(src: &[Self]) -> Option<&[KvQ8_0]> {
        let _ = src;
        None
    }

    /// Borrows `src` as [`KvQ4_0`] blocks when `Self` is `KvQ4_0`, as
    /// [`as_q8_0_slice`](Self::as_q8_0_slice); `None` for every other type.
    fn as_q4_0_slice(src: &[Self]) -> Option<&[KvQ4_0]> {
        let _ = src;
        None
    }
}

/// `values` stored as units of `T` (a whole number of units: `values.len()` a multiple of
/// `T::VALUES`, asserted).
pub fn kv_from_f32<T: KvElement>(values: &[f32]) -> Vec<T> {
    assert!(values.len().is_multiple_of(T::VALUES), "{} values are not whole units of {}", values.len(), T::VALUES);
    let mut units = vec![T::ZERO; values.len() / T::VALUES];
    T::slice_from_f32(values, &mut units);
    units
}

/// The values the units `units` hold, as `f32`.
pub fn kv_to_f32<T: KvElement>(units: &[T]) -> Vec<f32> {
    let mut values = vec![0.0; units.len() * T::VALUES];
    T::slice_to_f32(units, &mut values);
    values
}

impl KvElement for f32 {
    const ZERO: Self = 0.0;

    #[inline(always)]
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    #[inline(always)]
    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }

    #[inline(always)]
    fn as_f32_slice(src: &[Self]) -> Option<&[f32]> {
        Some(src)
    }
}

impl KvElement for f16 {
    const ZERO: Self = f16::ZERO;

    #[inline(always)]
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }

    #[inline(always)]
    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }

    #[inline(always)]
    fn as_f16_slice(src: &[Self]) -> Option<&[f16]> {
        Some(src)
    }
}

impl KvElement for bf16 {
    const ZERO: Self = bf16::ZERO;

    #[inline(always)]
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }

    #[inline(always)]
    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }

    #[inline(always)]
    fn as_bf16_slice(src: &[Self]) -> Option<&[bf16]> {
        Some(src)
    }
}
