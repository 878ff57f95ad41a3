//! The portable dot products, one per weight type: the definition every other path reproduces
//! bit for bit. For each output (weight row, activation row) one f32 accumulator takes, block
//! after block in order, fused multiply-adds of exact integer sums:
//!
//! - 32-value types against Q8_0: `acc = fma(Σ (q - offset) x, d * dx, acc)`, then for Q4_1 and
//!   Q5_1 `acc = fma(Σ x, m * dx, acc)`;
//! - Q4_K and Q5_K against Q8_K: `acc = fma(Σ_s sc_s Σ q x, d * dx, acc)`, then
//!   `acc = fma(Σ_s m_s Σ x, -(dmin * dx), acc)`;
//! - Q6_K: `acc = fma(Σ_s sc_s (Σ q x - 32 Σ x), d * dx, acc)`.
//!
//! The integer sums are exact whatever their order (they fit in 32 bits), so a kernel may sum
//! them any way it likes; the f32 steps are the same few operations on the same values in
//! every kernel, so the results do not depend on the kernel, the batch or the split.

use super::acts::{Q8KRow, Q8Row};
use super::blocks::{Block32, BlockK, QK_K, QK8_0, QuantType, block_k, block32};

/// One weight row (its blocks, in place) times one Q8_0 activation row.
pub(crate) fn dot32(ty: QuantType, w: &[u8], x: Q8Row) -> f32 {
    dot_blocks(ty, w.chunks_exact(ty.block_bytes()).map(|block| block32(ty, block)), x)
}

/// A row's decoded blocks, in order (from the file's layout or the interleaved one), times one
/// Q8_0 activation row.
pub(crate) fn dot_blocks(ty: QuantType, blocks: impl Iterator<Item = Block32>, x: Q8Row) -> f32 {
    let mut acc = 0.0f32;
    for (b, blk) in blocks.enumerate() {
        let xs = &x.qs[b * QK8_0..(b + 1) * QK8_0];
        let isum = blk.q.iter().zip(xs).map(|(&q, &x)| q as i32 * x as i32).sum::<i32>() - blk.offset * x.sums[b];
        acc = (isum as f32).mul_add(blk.d * x.d[b], acc);
        if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
            acc = (x.sums[b] as f32).mul_add(blk.m * x.d[b], acc);
        }
    }
    acc
}

/// One weight row (its super-blocks, in place) times one Q8_K activation row.
pub(crate) fn dot_k(ty: QuantType, w: &[u8], x: Q8KRow) -> f32 {
    dot_k_blocks(ty, w.chunks_exact(ty.block_bytes()).map(|block| block_k(ty, block)), x)
}

/// A row's decoded super-blocks, in order (from the file's layout or the interleaved one),
/// times one Q8_K activation row.
pub(crate) fn dot_k_blocks(ty: QuantType, blocks: impl Iterator<Item = BlockK>, x: Q8KRow) -> f32 {
    let mut acc = 0.0f32;
    for (b, blk) in blocks.enumerate() {
        let xs = &x.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &x.bsums[b * 16..(b + 1) * 16];
        let dot = |range: std::ops::Range<usize>| -> i32 {
            blk.q[range.clone()].iter().zip(&xs[range]).map(|(&q, &x)| q as i32 * x as i32).sum()
        };
        if ty == QuantType::Q6_K {
            let isum: i32 = (0..16).map(|s| blk.sc[s] * (dot(16 * s..16 * s + 16) - 32 * bsums[s] as i32)).sum();
            acc = (isum as f32).mul_add(blk.d * x.d[b], acc);
        } else {
            let isum: i32 = (0..8).map(|s| blk.sc[s] * dot(32 * s..32 * s + 32)).sum();
            let msum: i32 = (0..8).map(|s| blk.m[s] * (bsums[2 * s] as i32 + bsums[2 * s + 1] as i32)).sum();
            acc = (isum as f32).mul_add(blk.d * x.d[b], acc);
            acc = (msum as f32).mul_add(-(blk.dmin * x.d[b]), acc);
        }
    }
    acc
}
