//! Gated DeltaNet, the linear attention of Qwen3.5's recurrent layers, on the CPU: the
//! depthwise causal convolution over q/k/v with its rolling state, and the gated delta rule
//! over a per-head `[key_dim, value_dim]` f32 state, one sequence at a time, value heads in
//! parallel on the current rayon pool.
//!
//! The delta rule runs in its recurrent form for prefill and decode alike. Per token and head
//! it costs about 4 x key_dim x value_dim flops on a state that stays in cache (64 KiB for
//! 128 x 128), about 1% of a Qwen3.5 layer's matmuls, so the chunked (WY) form that GPUs need
//! for parallelism buys nothing here, and the recurrent form is the definition the chunked one
//! approximates in a different rounding order.

use rayon::prelude::*;

use crate::error::KernelError;

/// Head geometry of one Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetShape {
    /// Query/key heads.
    pub num_key_heads: usize,
    /// Value heads, a multiple of the key heads; the state has one matrix per value head.
    pub num_value_heads: usize,
    /// Width of a query/key head.
    pub key_dim: usize,
    /// Width of a value head.
    pub value_dim: usize,
    /// Value head `h` reads key head `h % num_key_heads` (llama.cpp's tiled order) rather than
    /// `h / (num_value_heads / num_key_heads)` (transformers' grouped order).
    pub tiled_value_heads: bool,
}

impl DeltaNetShape {
    /// The key head value head `head` reads.
    pub fn key_head_of(&self, head: usize) -> usize {
        if self.tiled_value_heads {
            head % self.num_key_heads
        } else {
            head / (self.num_value_heads / self.num_key_heads)
        }
    }

    /// f32 values of one sequence's state: `[value heads, key_dim, value_dim]`.
    pub fn state_len(&self) -> usize {
        self.num_value_heads * self.key_dim * self.value_dim
    }

    fn validate(&self) -> Result<(), KernelError> {
        if self.num_key_heads == 0
            || self.key_dim == 0
            || self.value_dim == 0
            || self.num_value_heads == 0
            || !self.num_value_heads.is_multiple_of(self.num_key_heads)
        {
            return Err(KernelError::HeadsNotMultiple {
                num_heads: self.num_value_heads,
                num_kv_heads: self.num_key_heads,
            });
        }
        Ok(())
    }
}

fn check_len(what: &'static str, actual: usize, expected: usize) -> Result<(), KernelError> {
    if actual == expected { Ok(()) } else { Err(KernelError::LengthMismatch { what, expected, actual }) }
}

/// Depthwise causal convolution then SiLU over one sequence's `rows` new inputs `x`
/// (`[rows, channels]`), continuing from `state` (`[kernel - 1, channels]`, the previous
/// inputs, oldest first), which is updated to end with this call's inputs. `weight` is
/// `[channels, kernel]`, the last tap multiplying the newest input. Writes `[rows, channels]`
/// into `out`.
pub fn causal_conv1d_silu(
    x: &[f32],
    weight: &[f32],
    kernel: usize,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    if kernel == 0 {
        return Err(KernelError::InvalidLayout("convolution kernel must be positive"));
    }
    let channels = weight.len() / kernel;
    check_len("conv weight", weight.len(), channels * kernel)?;
    check_len("conv state", state.len(), (kernel - 1) * channels)?;
    if channels == 0 || !x.len().is_multiple_of(channels) {
        return Err(KernelError::RaggedRows { what: "conv input", len: x.len(), row_len: channels });
    }
    check_len("conv output", out.len(), x.len())?;
    let rows = x.len() / channels;
    let history = kernel - 1;
    // The input row at time t - history + tap, reading the state for times before this call.
    let input = |t: usize, tap: usize| -> &[f32] {
        let time = t + tap;
        if time < history {
            &state[time * channels..(time + 1) * channels]
        } else {
            &x[(time - history) * channels..(time - history + 1) * channels]
        }
    };
    for t in 0..rows {
        let o = &mut out[t * channels..(t + 1) * channels];
        o.fill(0.0);
        for tap in 0..kernel {
            let row = input(t, tap);
            for (c, (o, &v)) in o.iter_mut().zip(row).enumerate() {
                *o += weight[c * kernel + tap] * v;
            }
        }
        for v in o.iter_mut() {
            *v = silu(*v);
        }
    }
    // The new state: the last `history` inputs of state ++ x.
    let mut next = vec![0.0f32; state.len()];
    for (i, row) in next.chunks_exact_mut(channels).enumerate() {
        row.copy_from_slice(input(rows, i));
    }
    state.copy_from_slice(&next);
    Ok(())
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The gated delta rule over one sequence's `rows` tokens, continuing from `state`
/// (`[value heads, key_dim, value_dim]`), which ends as the state after the last token. Per
/// token and value head h (key head k(h)), with `S` the head's state:
///
/// `S = exp(g) S;  S += k (beta (v - S^T k))^T;  out = S^T q`
///
/// `q` and `k` are `[rows, key heads * key_dim]` (already L2-normalised, q scaled by
/// `1/sqrt(key_dim)`), `v` and `out` `[rows, value heads * value_dim]`, `g` (the log decay,
/// at most 0) and `beta` `[rows, value heads]`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    shape: &DeltaNetShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    shape.validate()?;
    let DeltaNetShape { num_key_heads, num_value_heads, key_dim, value_dim, .. } = *shape;
    let rows = g.len() / num_value_heads;
    check_len("gate", g.len(), rows * num_value_heads)?;
    check_len("beta", beta.len(), rows * num_value_heads)?;
    check_len("query", q.len(), rows * num_key_heads * key_dim)?;
    check_len("key", k.len(), rows * num_key_heads * key_dim)?;
    check_len("value", v.len(), rows * num_value_heads * value_dim)?;
    check_len("output", out.len(), rows * num_value_heads * value_dim)?;
    check_len("state", state.len(), shape.state_len())?;
    let head_outputs: Vec<Vec<f32>> = state
        .par_chunks_exact_mut(key_dim * value_dim)
        .enumerate()
        .map(|(h, s)| {
            let kh = shape.key_head_of(h);
            let mut head_out = vec![0.0f32; rows * value_dim];
            let mut delta = vec![0.0f32; value_dim];
            for t in 0..rows {
                let qt = &q[(t * num_key_heads + kh) * key_dim..][..key_dim];
                let kt = &k[(t * num_key_heads + kh) * key_dim..][..key_dim];
                let vt = &v[(t * num_value_heads + h) * value_dim..][..value_dim];
                let decay = g[t * num_value_heads + h].exp();
                let b = beta[t * num_value_heads + h];
                // delta = beta (v - (decay S)^T k)
                delta.fill(0.0);
                for (i, row) in s.chunks_exact(value_dim).enumerate() {
                    let ki = kt[i];
                    for (d, &sij) in delta.iter_mut().zip(row) {
                        *d += ki * sij;
                    }
                }
                for (d, &vj) in delta.iter_mut().zip(vt) {
                    *d = (vj - decay * *d) * b;
                }
                // S = decay S + k delta^T; out = S^T q
                let o = &mut head_out[t * value_dim..(t + 1) * value_dim];
                for (i, row) in s.chunks_exact_mut(value_dim).enumerate() {
                    let (ki, qi) = (kt[i], qt[i]);
                    for ((sij, &d), oj) in row.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
                        *sij = decay * *sij + ki * d;
                        *oj += qi * *sij;
                    }
                }
            }
            head_out
        })
        .collect();
    for (h, head_out) in head_outputs.iter().enumerate() {
        for t in 0..rows {
            out[(t * num_value_heads + h) * value_dim..][..value_dim]
                .copy_from_slice(&head_out[t * value_dim..(t + 1) * value_dim]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 * 0.731 + seed).sin()) * 0.5).collect()
    }

    /// A convolution over rows split anywhere equals one over all rows at once, state included.
    #[test]
    fn convolution_in_pieces_equals_one_call() {
        let (channels, kernel, rows) = (5, 4, 9);
        let x = values(rows * channels, 0.3);
        let w = values(channels * kernel, 1.7);
        let mut state_once = values((kernel - 1) * channels, 2.1);
        let mut state_split = state_once.clone();
        let mut once = vec![0.0; x.len()];
        causal_conv1d_silu(&x, &w, kernel, &mut state_once, &mut once).unwrap();
        let mut split = vec![0.0; x.len()];
        for (a, b) in [(0, 1), (1, 3), (3, 9)] {
            let r = a * channels..b * channels;
            causal_conv1d_silu(&x[r.clone()], &w, kernel, &mut state_split, &mut split[r]).unwrap();
        }
        assert_eq!(once, split);
        assert_eq!(state_once, state_split);
        // The state holds the last three inputs.
        assert_eq!(state_once, x[(rows - 3) * channels..]);
    }

    proptest! {
        /// The delta rule over tokens split anywhere equals one call, and each value head reads
        /// the key head its order names.
        #[test]
        fn delta_rule_in_pieces_equals_one_call(rows in 1usize..12, split in 0usize..12, tiled: bool) {
            let split = split.min(rows);
            let shape = DeltaNetShape { num_key_heads: 2, num_value_heads: 4, key_dim: 3, value_dim: 5, tiled_value_heads: tiled };
            let q = values(rows * 6, 0.1);
            let k = values(rows * 6, 0.9);
            let v = values(rows * 20, 1.3);
            let g: Vec<f32> = values(rows * 4, 2.0).iter().map(|x| -x.abs()).collect();
            let beta: Vec<f32> = values(rows * 4, 3.0).iter().map(|x| 0.5 + x).collect();
            let mut s_once = values(shape.state_len(), 4.0);
            let mut s_split = s_once.clone();
            let mut once = vec![0.0; rows * 20];
            gated_delta_rule(&shape, &q, &k, &v, &g, &beta, &mut s_once, &mut once).unwrap();
            let mut out = vec![0.0; rows * 20];
            for (a, b) in [(0, split), (split, rows)] {
                if a == b { continue; }
                gated_delta_rule(&shape, &q[a * 6..b * 6], &k[a * 6..b * 6], &v[a * 20..b * 20], &g[a * 4..b * 4],
                    &beta[a * 4..b * 4], &mut s_split, &mut out[a * 20..b * 20]).unwrap();
            }
            prop_assert_eq!(&once, &out);
            prop_assert_eq!(&s_once, &s_split);
        }
    }

    /// One token from a zero state: `S = beta k v^T`, so `out = beta (k . q) v`.
    #[test]
    fn first_token_from_zero_state() {
        for tiled in [false, true] {
            let shape = DeltaNetShape {
                num_key_heads: 2,
                num_value_heads: 4,
                key_dim: 2,
                value_dim: 3,
                tiled_value_heads: tiled,
            };
            let q = [1.0, 0.0, 0.0, 2.0];
            let k = [0.5, 0.5, 1.0, 1.0];
            let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
            let (g, beta) = ([-0.3; 4], [0.5; 4]);
            let mut state = vec![0.0; shape.state_len()];
            let mut out = vec![0.0; 12];
            gated_delta_rule(&shape, &q, &k, &v, &g, &beta, &mut state, &mut out).unwrap();
            for h in 0..4 {
                let kh = shape.key_head_of(h);
                let dot: f32 = (0..2).map(|i| q[kh * 2 + i] * k[kh * 2 + i]).sum();
                for j in 0..3 {
                    assert!((out[h * 3 + j] - 0.5 * dot * v[h * 3 + j]).abs() < 1e-6, "tiled {tiled} head {h}");
                }
            }
            assert_eq!(shape.key_head_of(1), if tiled { 1 } else { 0 });
        }
    }
}
