//! The portable micro-kernel: the same integer sums and the same order of fused
//! multiply-adds as the AVX2 one, so both give bitwise equal results.

use super::QK8_0;
use super::matrix::{GROUP_BLOCK, ROWS};

/// `N` activation rows times one group of `ROWS` weight rows: `acc[n][r]` is the dot product
/// of activation row `n` with weight row `r`. `wq`/`ws` are the group's repacked values and
/// scales over all blocks, `xq[n]`/`xs[n]` one activation row's values and scales.
pub(crate) fn tile<const N: usize>(wq: &[i8], ws: &[f32], xq: [&[i8]; N], xs: [&[f32]; N]) -> [[f32; ROWS]; N] {
    let nb = ws.len() / ROWS;
    let mut acc = [[0.0f32; ROWS]; N];
    for (n, acc) in acc.iter_mut().enumerate() {
        for b in 0..nb {
            let w = &wq[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            let x = &xq[n][b * QK8_0..(b + 1) * QK8_0];
            for (r, acc) in acc.iter_mut().enumerate() {
                let mut sum = 0i32;
                for (c, x) in x.chunks_exact(4).enumerate() {
                    let w = &w[c * QK8_0 + r * 4..c * QK8_0 + r * 4 + 4];
                    sum += w.iter().zip(x).map(|(&w, &x)| w as i32 * x as i32).sum::<i32>();
                }
                *acc = (sum as f32).mul_add(ws[b * ROWS + r] * xs[n][b], *acc);
            }
        }
    }
    acc
}
