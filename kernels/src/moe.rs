//! Mixture-of-experts routing: which experts a row goes to and with what weights. [`top_k`] is
//! the rule every path follows (torch.topk's: the larger probability first, equal ones the
//! lower expert first); [`route_device_order`] is the CUDA kernel (`cuda/moe.cu`,
//! `radix_moe_topk`) in plain Rust, with the same order of every sum, so the CPU tests hold it
//! to the rule and a device check has only to hold the device to it.

use crate::error::KernelError;

/// Most experts a layer may have on the CUDA kernel (32 lanes x 16 registers).
pub const MAX_EXPERTS: usize = 512;

/// The `k` experts of `probs` with the largest probabilities, largest first; of equal
/// probabilities the lower expert comes first (as torch.topk, and so transformers).
pub fn top_k(probs: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// Checks a routing shape against the kernel: `1 <= k <= experts <= MAX_EXPERTS`.
pub fn validate_routing(experts: usize, k: usize) -> Result<(), KernelError> {
    if experts == 0 || experts > MAX_EXPERTS || k == 0 || k > experts {
        return Err(KernelError::Device(format!(
            "routing {k} of {experts} experts: the CUDA kernel takes 1 <= k <= experts <= {MAX_EXPERTS}"
        )));
    }
    Ok(())
}

/// The xor butterfly of 32 lanes (`warp_sum`), which every lane ends with.
fn butterfly(mut lanes: [f32; 32]) -> f32 {
    let mut o = 16;
    while o > 0 {
        let before = lanes;
        for (l, v) in lanes.iter_mut().enumerate() {
            *v = before[l] + before[l ^ o];
        }
        o /= 2;
    }
    lanes[0]
}

/// `radix_moe_topk` on every row of `logits` (`[rows, experts]`): the softmax (lane `l` of a
/// warp holds experts `l, l + 32, ...`, sums its own in order, then the butterfly), the top `k`
/// by [`top_k`]'s rule, renormalised to sum to 1 (in rank order) when `renormalize`. Returns
/// the ids and weights, `[rows, k]` each.
pub fn route_device_order(
    logits: &[f32],
    experts: usize,
    k: usize,
    renormalize: bool,
) -> Result<(Vec<u32>, Vec<f32>), KernelError> {
    validate_routing(experts, k)?;
    if !logits.len().is_multiple_of(experts) {
        return Err(KernelError::RaggedRows { what: "router logits", len: logits.len(), row_len: experts });
    }
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for x in logits.chunks_exact(experts) {
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut p: Vec<f32> = x.iter().map(|&v| (v - m).exp()).collect();
        let mut lanes = [0.0f32; 32];
        for (e, &v) in p.iter().enumerate() {
            lanes[e % 32] += v;
        }
        let sum = butterfly(lanes);
        p.iter_mut().for_each(|v| *v /= sum);
        let chosen = top_k(&p, k);
        let mut total = 0.0f32;
        for &e in &chosen {
            total += p[e];
        }
        for &e in &chosen {
            ids.push(e as u32);
            weights.push(if renormalize { p[e] / total } else { p[e] });
        }
    }
    Ok((ids, weights))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The softmax as written in a textbook (and candle's CPU op): max, exp, one sum in order.
    fn softmax(x: &[f32]) -> Vec<f32> {
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = x.iter().map(|&v| (v - m).exp()).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    #[test]
    fn equal_probabilities_keep_the_lower_expert_first() {
        assert_eq!(top_k(&[0.1, 0.3, 0.3, 0.0, 0.3], 2), [1, 2]);
        assert_eq!(top_k(&[0.25; 4], 3), [0, 1, 2]);
        assert_eq!(top_k(&[0.1, 0.2, 0.7], 3), [2, 1, 0]);
        // Equal logits give bitwise equal probabilities on every path, so ties are real.
        for renormalize in [false, true] {
            let (ids, w) =
                route_device_order(&[1.0, 3.0, 3.0, 0.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0], 5, 2, renormalize).unwrap();
            assert_eq!(ids, [1, 2, 0, 1]);
            assert_eq!(w[0], w[1]);
            if renormalize {
                assert_eq!(w, [0.5; 4]);
            }
        }
        // A tie across lanes' registers: experts 3 and 35 (lane 3, registers 0 and 1) and 67.
        let mut logits = vec![0.0f32; 70];
        for e in [67, 35, 3] {
            logits[e] = 5.0;
        }
        assert_eq!(route_device_order(&logits, 70, 3, true).unwrap().0, [3, 35, 67]);
    }

    proptest! {
        /// The kernel's order picks the experts the CPU path picks, with its weights, for
        /// expert counts within one lane's register, across several, and at the maximum.
        #[test]
        fn device_order_routes_as_the_cpu_path(
            experts in prop::sample::select(vec![4usize, 31, 60, 128, 512]),
            k in 1usize..9,
            renormalize: bool,
            seed in 0u64..1000,
        ) {
            let k = k.min(experts);
            let rows = 3;
            let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let logits: Vec<f32> = (0..rows * experts).map(|_| {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
            }).collect();
            let (ids, weights) = route_device_order(&logits, experts, k, renormalize).unwrap();
            for (r, x) in logits.chunks_exact(experts).enumerate() {
                let p = softmax(x);
                let want = top_k(&p, k);
                let got: Vec<usize> = ids[r * k..(r + 1) * k].iter().map(|&e| e as usize).collect();
                // Probabilities a few ulp apart may swap between the two sums' roundings.
                for (g, w) in got.iter().zip(&want) {
                    prop_assert!(g == w || (p[*g] - p[*w]).abs() <= 1e-6 * p[*w], "row {}: {:?} vs {:?}", r, got, want);
                }
                let total: f32 = want.iter().map(|&e| p[e]).sum();
                for (j, &e) in want.iter().enumerate() {
                    let w = if renormalize { p[e] / total } else { p[e] };
                    prop_assert!((weights[r * k + j] - w).abs() <= 1e-5 * (1.0 + w), "row {}: {} vs {}", r, weights[r * k + j], w);
                }
            }
        }
    }

    #[test]
    fn shapes_the_kernel_cannot_take_are_refused() {
        assert!(validate_routing(128, 8).is_ok());
        assert!(
            validate_routing(513, 8).is_err() && validate_routing(4, 5).is_err() && validate_routing(4, 0).is_err()
        );
        assert!(route_device_order(&[0.0; 7], 4, 2, true).is_err());
    }
}
