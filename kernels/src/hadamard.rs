//! The orthonormal Walsh-Hadamard rotation the block-quantized K/V types are stored in.
//!
//! A few K channels of a trained model carry values many times larger than the rest (outlier
//! channels). Quantized as they are, each block's scale follows its outlier and the other
//! values of the block round to a handful of steps: 4-bit K then loses most of the attention
//! pattern (benches/README.md, "Quantized KV"). Rotated by a normalized Hadamard matrix `H`, a
//! head's values are spread evenly over its channels before they are quantized. `H` is
//! orthonormal and its own inverse, so `(H q) · (H k) = q · k` and `H Σ p v' = Σ p v` for
//! `v' = H v`: [`write_kv`](crate::write_kv) stores `H k` and `H v` for the types whose
//! [`KvElement::ROTATED`](crate::KvElement::ROTATED) is set, and
//! [`paged_attention`](crate::paged_attention) rotates the queries and the output back.
//!
//! The rotation is per head, over blocks of a power of two dividing the head size
//! ([`k_rotation_block`], [`v_rotation_block`]), and each row's result depends only on that
//! row: a token's stored K/V stays independent of its batch.

/// The Hadamard block K is rotated in for a head of `head_dim` values: the largest power of
/// two dividing it (the whole head of every Qwen and Llama model; 1 for an odd head, which
/// stays as it is), as llama.cpp rotates its quantized K.
pub fn k_rotation_block(head_dim: usize) -> usize {
    if head_dim == 0 { 1 } else { 1 << head_dim.trailing_zeros() }
}

/// The Hadamard block V is rotated in: [`k_rotation_block`], at most 64. llama.cpp found the
/// smaller rotation better for V and uses 64 throughout.
pub fn v_rotation_block(head_dim: usize) -> usize {
    k_rotation_block(head_dim).min(64)
}

/// Rotates `values` block by block (`block` a power of two dividing `values.len()`, as the
/// rotation blocks above divide a head) by the normalized Hadamard matrix of that size. Applied
/// twice it gives the values back, up to f32 rounding.
pub fn hadamard_rotate(values: &mut [f32], block: usize) {
    assert!(
        block.is_power_of_two() && values.len().is_multiple_of(block),
        "Hadamard blocks of {block} values over {} values",
        values.len()
    );
    if block == 1 {
        return;
    }
    let norm = hadamard_norm(block);
    for part in values.chunks_exact_mut(block) {
        butterflies(part);
        for x in part.iter_mut() {
            *x *= norm;
        }
    }
}

/// The factor that normalizes a Hadamard block of `block` values, `1 / sqrt(block)`, rounded
/// once here for the CPU path and the GPU kernels alike.
pub(crate) fn hadamard_norm(block: usize) -> f32 {
    1.0 / (block as f32).sqrt()
}

/// The unnormalized fast Walsh-Hadamard transform of a power-of-two block, in Sylvester's order,
/// summed in the same order for every block.
fn butterflies(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut half = 1;
    while half < n {
        for pair in x.chunks_exact_mut(2 * half) {
            let (low, high) = pair.split_at_mut(half);
            for (a, b) in low.iter_mut().zip(high) {
                let (sum, diff) = (*a + *b, *a - *b);
                *a = sum;
                *b = diff;
            }
        }
        half *= 2;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Sylvester's Hadamard matrix entry `(i, j)`: the parity of the bits `i` and `j` share.
    fn entry(i: usize, j: usize) -> f64 {
        if (i & j).count_ones().is_multiple_of(2) { 1.0 } else { -1.0 }
    }

    #[test]
    fn blocks_are_the_largest_power_of_two_dividing_the_head() {
        assert_eq!([64, 128, 256, 96, 80, 33].map(k_rotation_block), [64, 128, 256, 32, 16, 1]);
        assert_eq!([64, 128, 256, 96, 80, 33].map(v_rotation_block), [64, 64, 64, 32, 16, 1]);
    }

    proptest! {
        #[test]
        fn the_rotation_is_the_normalized_hadamard_matrix_and_its_own_inverse(
            log_block in 0u32..9,
            blocks in 1usize..6,
            seed in any::<u64>(),
        ) {
            let block = 1usize << log_block;
            let mut state = seed | 1;
            let values: Vec<f32> = (0..blocks * block)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
                .collect();
            let mut rotated = values.clone();
            hadamard_rotate(&mut rotated, block);
            for (b, (got, x)) in rotated.chunks(block).zip(values.chunks(block)).enumerate() {
                for (i, &g) in got.iter().enumerate() {
                    let want: f64 = (0..block).map(|j| entry(i, j) * x[j] as f64).sum::<f64>() / (block as f64).sqrt();
                    prop_assert!((g as f64 - want).abs() <= 1e-5, "block {b} value {i}: {g} vs {want}");
                }
            }
            let norm = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>();
            prop_assert!((norm(&rotated) - norm(&values)).abs() <= 1e-4 * norm(&values).max(1.0));
            let mut back = rotated;
            hadamard_rotate(&mut back, block);
            for (b, x) in back.iter().zip(&values) {
                prop_assert!((b - x).abs() <= 1e-5, "{b} vs {x}");
            }
        }
    }
}
