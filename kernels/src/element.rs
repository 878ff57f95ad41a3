//! Storage element types of the paged KV pool.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Element type of K/V storage: `f32`, [`half::f16`], [`half::bf16`].
///
/// Attention always computes in `f32`; K/V rows are converted on load and
/// rounded on store ([`write_kv`](crate::write_kv)).
pub trait KvElement: Copy + Send + Sync + 'static {
    /// Converts one element to `f32` (exact for all three types).
    fn to_f32(self) -> f32;

    /// Rounds an `f32` to this type (round to nearest even).
    fn from_f32(x: f32) -> Self;

    /// Converts `src` into `dst` element by element; `dst.len()` must equal
    /// `src.len()`. Overridden where a faster bulk conversion exists.
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        debug_assert_eq!(src.len(), dst.len());
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }

    /// Rounds `src` into `dst` element by element; `dst.len()` must equal
    /// `src.len()`. Overridden where a faster bulk conversion exists.
    fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
        debug_assert_eq!(src.len(), dst.len());
        for (d, s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(*s);
        }
    }

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
}

impl KvElement for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }

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
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }

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
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }

    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }

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
