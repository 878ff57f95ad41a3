//! Block-quantized K/V storage: GGUF's `q8_0` and `q4_0` block layouts (one f16 scale per 32
//! values), written by [`write_kv`](crate::write_kv) and converted to f32 tile by tile by
//! [`paged_attention`](crate::paged_attention).
//!
//! The rounding is ggml's reference quantizer (`quantize_row_q8_0_ref`,
//! `quantize_row_q4_0_ref`), so a block holds the bytes llama.cpp would store for the same
//! values, and a value's stored form depends only on its own block: a token's K/V is the same
//! whatever else was written with it, which keeps prefix reuse exact.
//!
//! Both types hold each head rotated into the Hadamard basis ([`crate::hadamard_rotate`]), as
//! llama.cpp stores its quantized K/V: a block then quantizes values of like magnitude instead
//! of one outlier channel and 31 values rounded to a few steps.

use half::f16;

use crate::KvElement;

/// Values per quantized block.
pub const KV_BLOCK: usize = 32;

/// 32 values as `d * q` with `q` in -127..=127: 34 bytes, 8.5 bits a value.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct KvQ8_0 {
    /// The scale: the largest magnitude over 127.
    pub d: f16,
    /// The values over `d`, rounded half away from zero.
    pub qs: [i8; KV_BLOCK],
}

/// 32 values as `d * (q - 8)` with `q` in 0..=15: 18 bytes, 4.5 bits a value. Byte `j` holds
/// value `j` in its low nibble and value `j + 16` in its high one.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct KvQ4_0 {
    /// The scale: the value of largest magnitude over -8 (so it maps to `q = 0` exactly).
    pub d: f16,
    /// Two values a byte.
    pub qs: [u8; KV_BLOCK / 2],
}

impl KvQ8_0 {
    /// Quantizes one block.
    pub fn quantize(x: &[f32; KV_BLOCK]) -> Self {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        KvQ8_0 { d: f16::from_f32(d), qs: x.map(|v| (v * id).round() as i8) }
    }

    /// The block's values.
    #[inline(always)]
    pub fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out[..KV_BLOCK].iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }

    /// Value `j` of the block, the bits [`dequantize`](Self::dequantize) gives it.
    #[inline(always)]
    pub fn value(&self, j: usize) -> f32 {
        self.qs[j] as f32 * self.d.to_f32()
    }
}

impl KvQ4_0 {
    /// Quantizes one block.
    pub fn quantize(x: &[f32; KV_BLOCK]) -> Self {
        // The signed value of largest magnitude (the first one on a tie), as ggml picks it.
        let max = x.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| ((v * id + 8.5) as i32).min(15) as u8;
        let qs = std::array::from_fn(|j| q(x[j]) | (q(x[j + KV_BLOCK / 2]) << 4));
        KvQ4_0 { d: f16::from_f32(d), qs }
    }

    /// The block's values.
    #[inline(always)]
    pub fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let (low, high) = out[..KV_BLOCK].split_at_mut(KV_BLOCK / 2);
        for ((l, h), &q) in low.iter_mut().zip(high).zip(&self.qs) {
            *l = ((q & 0x0F) as i32 - 8) as f32 * d;
            *h = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }

    /// Value `j` of the block, the bits [`dequantize`](Self::dequantize) gives it.
    #[inline(always)]
    pub fn value(&self, j: usize) -> f32 {
        let q = self.qs[j % (KV_BLOCK / 2)];
        let q = if j < KV_BLOCK / 2 { q & 0x0F } else { q >> 4 };
        (q as i32 - 8) as f32 * self.d.to_f32()
    }
}

macro_rules! block_element {
    ($block:ty, $zero:expr, $as_slice:ident) => {
        impl KvElement for $block {
            const VALUES: usize = KV_BLOCK;
            const ZERO: Self = $zero;
            const ROTATED: bool = true;

            #[inline(always)]
            fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
                assert_eq!(dst.len(), src.len() * KV_BLOCK, "room for the blocks' values");
                for (block, out) in src.iter().zip(dst.chunks_exact_mut(KV_BLOCK)) {
                    block.dequantize(out);
                }
            }

            fn slice_from_f32(src: &[f32], dst: &mut [Self]) {
                assert_eq!(src.len(), dst.len() * KV_BLOCK, "whole blocks of values");
                for (block, x) in dst.iter_mut().zip(src.chunks_exact(KV_BLOCK)) {
                    *block = <$block>::quantize(x.try_into().expect("chunks of a block"));
                }
            }

            #[inline(always)]
            fn $as_slice(src: &[Self]) -> Option<&[$block]> {
                Some(src)
            }
        }
    };
}

block_element!(KvQ8_0, KvQ8_0 { d: f16::ZERO, qs: [0; KV_BLOCK] }, as_q8_0_slice);
block_element!(KvQ4_0, KvQ4_0 { d: f16::ZERO, qs: [0x88; KV_BLOCK / 2] }, as_q4_0_slice);

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// ggml's reference quantizers written out plainly (ggml-quants.c), for the bytes.
    fn ggml_q8_0(x: &[f32]) -> (f16, Vec<i8>) {
        let amax = x.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        (f16::from_f32(d), x.iter().map(|v| (v * id).round() as i8).collect())
    }

    fn ggml_q4_0(x: &[f32]) -> (f16, Vec<u8>) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q = |v: f32| 15.min((v * id + 8.5) as i8) as u8;
        (f16::from_f32(d), (0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)).collect())
    }

    fn block() -> impl Strategy<Value = [f32; KV_BLOCK]> {
        (prop::array::uniform32(-1.0f32..1.0), -6i32..6).prop_map(|(x, e)| x.map(|v| v * 2f32.powi(e)))
    }

    proptest! {
        /// The bytes are ggml's, and each value comes back within half a step of the scale.
        #[test]
        fn q8_0_is_ggml_and_within_half_a_step(x in block()) {
            let b = KvQ8_0::quantize(&x);
            let (d, qs) = ggml_q8_0(&x);
            prop_assert_eq!((b.d, b.qs.to_vec()), (d, qs));
            let mut back = [0.0f32; KV_BLOCK];
            b.dequantize(&mut back);
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (v, w) in x.iter().zip(&back) {
                // Half a step, plus the scale's own f16 rounding over up to 127 steps.
                prop_assert!((v - w).abs() <= amax / 254.0 + amax * 2f32.powi(-11) * 1.01, "{v} -> {w}");
            }
        }

        #[test]
        fn q4_0_is_ggml_and_within_half_a_step(x in block()) {
            let b = KvQ4_0::quantize(&x);
            let (d, qs) = ggml_q4_0(&x);
            prop_assert_eq!((b.d, b.qs.to_vec()), (d, qs));
            let mut back = [0.0f32; KV_BLOCK];
            b.dequantize(&mut back);
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (v, w) in x.iter().zip(&back) {
                // Steps of amax / 8 (the top value clamps to 7 steps up: one step off at most).
                prop_assert!((v - w).abs() <= amax / 8.0 * 1.01, "{v} -> {w}");
            }
        }

        /// Whole rows through the trait: a unit depends only on its own 32 values.
        #[test]
        fn rows_quantize_block_by_block(x in prop::collection::vec(-3.0f32..3.0, 4 * KV_BLOCK)) {
            let whole: Vec<KvQ8_0> = crate::kv_from_f32(&x);
            let pieces: Vec<KvQ8_0> = x.chunks(KV_BLOCK).flat_map(crate::kv_from_f32::<KvQ8_0>).collect();
            prop_assert_eq!(&whole, &pieces);
            let back = crate::kv_to_f32(&whole);
            prop_assert_eq!(back.len(), x.len());
        }
    }

    #[test]
    fn zero_units_hold_zeros_and_sizes_are_ggml_s() {
        assert_eq!(std::mem::size_of::<KvQ8_0>(), 34);
        assert_eq!(std::mem::size_of::<KvQ4_0>(), 18);
        assert!(crate::kv_to_f32(&[KvQ8_0::ZERO, KvQ8_0::ZERO]).iter().all(|&v| v == 0.0));
        assert!(crate::kv_to_f32(&[KvQ4_0::ZERO]).iter().all(|&v| v == 0.0));
        assert_eq!(KvQ4_0::quantize(&[0.0; KV_BLOCK]), KvQ4_0::ZERO);
        assert_eq!(KvQ8_0::quantize(&[0.0; KV_BLOCK]), KvQ8_0::ZERO);
    }
}
