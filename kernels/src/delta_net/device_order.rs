//! The Gated DeltaNet as the CUDA kernels (`cuda/delta_net.cu`) compute it, in plain Rust: the
//! same packed pass (several sequences' new rows, each continuing its state-pool slot), the same
//! fused steps (L2 norms, gates and the delta rule in one sweep) and the same order of every
//! sum, `mul_add` where the kernel has `fmaf`. The CPU tests hold this model to the CPU kernels
//! ([`super::causal_conv1d_silu`], [`super::gated_delta_rule`]), so a device check has only to
//! hold the device to this model. It is a reference, not a fast path: nothing serves with it.
//!
//! What the model cannot pin to the bit: with `--use_fast_math` the device's `expf`, division
//! and square root are approximations (a few ulp), so device and model agree within a
//! tolerance (`DEVICE_TOLERANCE`), not exactly.

use super::{DeltaNetShape, softplus};
use crate::error::KernelError;

/// Value columns of the state one CUDA block owns (`COLS`).
pub const COLUMNS_PER_BLOCK: usize = 32;
/// Threads sharing one column's key rows (`SPLIT`): thread `p` holds rows `p, p + 4, ...`.
pub const SPLIT: usize = 4;
/// Convolution widths with a compiled kernel.
pub const CONV_KERNELS: std::ops::RangeInclusive<usize> = 2..=6;
/// Largest relative difference (to 1 + |value|) expected between the device and this model:
/// the fast-math `expf`, division and `sqrtf` are within a few ulp, compounded over a sequence.
pub const DEVICE_TOLERANCE: f32 = 1e-4;

/// One sequence of a packed pass, as the kernels read it (4 words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentSequence {
    /// Its first row in the pass.
    pub first_row: usize,
    /// Its new rows.
    pub rows: usize,
    /// Its slot in the state pool.
    pub slot: usize,
    /// Whether it starts from a zero state (its first row is position 0) instead of the slot's.
    pub fresh: bool,
}

impl RecurrentSequence {
    /// The kernels' 4 words.
    pub fn words(&self) -> [u32; 4] {
        [self.first_row as u32, self.rows as u32, self.slot as u32, u32::from(self.fresh)]
    }
}

/// The key width a kernel is compiled for that holds `key_dim` (`KMAX`: 32, 64, 128 or 256).
pub fn key_capacity(key_dim: usize) -> Option<usize> {
    [32, 64, 128, 256].into_iter().find(|&k| key_dim <= k && key_dim > 0)
}

/// Checks a pass against its rows and the pool: sequences in row order without overlap, rows
/// inside the pass, slots inside the pool, no slot twice (two blocks would race on it), and
/// every index fits the kernels' 32-bit words.
pub fn validate_sequences(seqs: &[RecurrentSequence], n_rows: usize, num_slots: usize) -> Result<(), KernelError> {
    let bad = |m: String| Err(KernelError::Device(m));
    if n_rows > u32::MAX as usize || num_slots > u32::MAX as usize {
        return bad(format!("{n_rows} rows or {num_slots} slots do not fit the kernels' 32-bit indices"));
    }
    let mut next = 0;
    let mut slots: Vec<usize> = Vec::with_capacity(seqs.len());
    for (i, s) in seqs.iter().enumerate() {
        if s.first_row < next || s.first_row + s.rows > n_rows {
            return bad(format!(
                "sequence {i}: rows {}..{} overlap another or pass the pass's {n_rows}",
                s.first_row,
                s.first_row + s.rows
            ));
        }
        if s.slot >= num_slots {
            return bad(format!("sequence {i}: state slot {} is outside the pool's {num_slots}", s.slot));
        }
        if slots.contains(&s.slot) {
            return bad(format!("sequence {i}: state slot {} is used twice in one pass", s.slot));
        }
        slots.push(s.slot);
        next = s.first_row + s.rows;
    }
    Ok(())
}

/// `radix_gdn_conv_k*`: the depthwise causal convolution and SiLU of every sequence's rows of
/// `x` (`[rows, channels]`), continuing the slots of `state` (`[slots, kernel - 1, channels]`),
/// into `out`. Per channel: `acc = fma(w[tap], input[tap], acc)` over the taps oldest first.
pub fn conv(
    x: &[f32],
    weight: &[f32],
    kernel: usize,
    state: &mut [f32],
    out: &mut [f32],
    seqs: &[RecurrentSequence],
) -> Result<(), KernelError> {
    if !CONV_KERNELS.contains(&kernel) {
        return Err(KernelError::Device(format!("convolution width {kernel} has no kernel ({CONV_KERNELS:?})")));
    }
    let channels = weight.len() / kernel;
    let history = kernel - 1;
    if channels == 0 || !x.len().is_multiple_of(channels) || out.len() != x.len() {
        return Err(KernelError::RaggedRows { what: "conv input", len: x.len(), row_len: channels });
    }
    let slot_len = history * channels;
    if !state.len().is_multiple_of(slot_len) {
        return Err(KernelError::RaggedRows { what: "conv state", len: state.len(), row_len: slot_len });
    }
    validate_sequences(seqs, x.len() / channels, state.len() / slot_len)?;
    for s in seqs {
        let st = &mut state[s.slot * slot_len..(s.slot + 1) * slot_len];
        for c in 0..channels {
            let w = &weight[c * kernel..(c + 1) * kernel];
            let mut win: Vec<f32> = (0..history).map(|h| if s.fresh { 0.0 } else { st[h * channels + c] }).collect();
            for t in 0..s.rows {
                let at = (s.first_row + t) * channels + c;
                let xt = x[at];
                let mut acc = 0.0f32;
                for tap in 0..history {
                    acc = w[tap].mul_add(win[tap], acc);
                }
                acc = w[history].mul_add(xt, acc);
                win.rotate_left(1);
                win[history - 1] = xt;
                out[at] = acc / (1.0 + (-acc).exp());
            }
            for (h, &v) in win.iter().enumerate() {
                st[h * channels + c] = v;
            }
        }
    }
    Ok(())
}

/// The per-head gates of a row: `(exp(neg_rate softplus(a + dt_bias)), sigmoid(b))`.
fn gates(a: f32, b: f32, neg_rate: f32, dt_bias: f32) -> (f32, f32) {
    ((neg_rate * softplus(a + dt_bias)).exp(), 1.0 / (1.0 + (-b).exp()))
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

/// A head's L2 norm factor as warp 0 (q) or 1 (k) makes it: lane `l` sums the squares of
/// elements `l, l + 32, ...` with `fma`, then the butterfly.
fn norm_factor(v: &[f32], scale: f32) -> f32 {
    let mut lanes = [0.0f32; 32];
    for (i, &x) in v.iter().enumerate() {
        lanes[i % 32] = x.mul_add(x, lanes[i % 32]);
    }
    scale / (butterfly(lanes) + 1e-6).sqrt()
}

/// `radix_gdn_rule_k*`: for every sequence and value head, the L2-normalised q/k, the gates and
/// the gated delta rule over the rows, continuing the slot's state (`[slots, value heads,
/// key_dim, value_dim]`) in `state`. `qkv` is the convolution's output (`[rows, channels]`),
/// `a` and `b` the raw projections (`[rows, value heads]`), `neg_decay_rate` (`-exp(A_log)`)
/// and `dt_bias` per value head. Writes `[rows, value heads, value_dim]` into `out`.
#[allow(clippy::too_many_arguments)]
pub fn rule(
    shape: &DeltaNetShape,
    qkv: &[f32],
    a: &[f32],
    b: &[f32],
    neg_decay_rate: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    seqs: &[RecurrentSequence],
) -> Result<(), KernelError> {
    shape.validate()?;
    let DeltaNetShape { num_key_heads: nk, num_value_heads: nv, key_dim: dk, value_dim: dv, .. } = *shape;
    if key_capacity(dk).is_none() {
        return Err(KernelError::Device(format!("key head width {dk} has no kernel (at most 256)")));
    }
    let channels = 2 * nk * dk + nv * dv;
    let rows = qkv.len() / channels;
    let check = |what, actual: usize, expected: usize| {
        if actual == expected { Ok(()) } else { Err(KernelError::LengthMismatch { what, expected, actual }) }
    };
    check("qkv", qkv.len(), rows * channels)?;
    check("a", a.len(), rows * nv)?;
    check("b", b.len(), rows * nv)?;
    check("decay rate", neg_decay_rate.len(), nv)?;
    check("dt bias", dt_bias.len(), nv)?;
    check("output", out.len(), rows * nv * dv)?;
    let slot_len = shape.state_len();
    if !state.len().is_multiple_of(slot_len) {
        return Err(KernelError::RaggedRows { what: "SSM state", len: state.len(), row_len: slot_len });
    }
    validate_sequences(seqs, rows, state.len() / slot_len)?;
    let q_scale = 1.0 / (dk as f32).sqrt();
    for s in seqs {
        for h in 0..nv {
            let kh = shape.key_head_of(h);
            let head = &mut state[(s.slot * nv + h) * dk * dv..][..dk * dv];
            if s.fresh {
                head.fill(0.0);
            }
            for t in 0..s.rows {
                let row = s.first_row + t;
                let q = &qkv[row * channels + kh * dk..][..dk];
                let k = &qkv[row * channels + (nk + kh) * dk..][..dk];
                let (fq, fk) = (norm_factor(q, q_scale), norm_factor(k, 1.0));
                let (decay, beta) = gates(a[row * nv + h], b[row * nv + h], neg_decay_rate[h], dt_bias[h]);
                for j in 0..dv {
                    let kv = chain(|i| (k[i] * fk, head[i * dv + j]), dk);
                    let v = qkv[row * channels + 2 * nk * dk + h * dv + j];
                    let delta = (v - decay * kv) * beta;
                    for i in 0..dk {
                        head[i * dv + j] = (k[i] * fk).mul_add(delta, decay * head[i * dv + j]);
                    }
                    out[(row * nv + h) * dv + j] = chain(|i| (q[i] * fq, head[i * dv + j]), dk);
                }
            }
        }
    }
    Ok(())
}

/// `sum_i x_i y_i` as the kernel's SPLIT threads make it: thread `p` chains `fma` over rows
/// `p, p + SPLIT, ...`, then `(p0 + p1) + (p2 + p3)` (the butterfly over lanes 8 and 16 apart).
fn chain(xy: impl Fn(usize) -> (f32, f32), key_dim: usize) -> f32 {
    let mut parts = [0.0f32; SPLIT];
    for (p, part) in parts.iter_mut().enumerate() {
        for i in (p..key_dim).step_by(SPLIT) {
            let (x, y) = xy(i);
            *part = x.mul_add(y, *part);
        }
    }
    (parts[0] + parts[1]) + (parts[2] + parts[3])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::delta_net::{causal_conv1d_silu, gated_delta_rule, l2_normalize};

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 * 0.731 + seed).sin()) * 0.9).collect()
    }

    /// A pass as the model's layer feeds the kernels: the convolution's input rows, the raw
    /// gate projections, the per-head parameters, and state pools of `slots` slots.
    struct Pass {
        shape: DeltaNetShape,
        kernel: usize,
        qkv_in: Vec<f32>,
        conv_w: Vec<f32>,
        a: Vec<f32>,
        b: Vec<f32>,
        neg_rate: Vec<f32>,
        dt_bias: Vec<f32>,
        conv_state: Vec<f32>,
        ssm_state: Vec<f32>,
    }

    impl Pass {
        fn new(shape: DeltaNetShape, kernel: usize, rows: usize, slots: usize) -> Self {
            let nv = shape.num_value_heads;
            let channels = 2 * shape.num_key_heads * shape.key_dim + nv * shape.value_dim;
            Pass {
                shape,
                kernel,
                qkv_in: values(rows * channels, 0.3),
                conv_w: values(channels * kernel, 1.7),
                a: values(rows * nv, 2.2),
                b: values(rows * nv, 0.4),
                neg_rate: (0..nv).map(|h| -0.2 - 0.1 * h as f32).collect(),
                dt_bias: values(nv, 5.0),
                conv_state: values(slots * (kernel - 1) * channels, 3.1),
                ssm_state: values(slots * shape.state_len(), 4.2),
            }
        }

        fn channels(&self) -> usize {
            self.conv_w.len() / self.kernel
        }

        /// The CPU path: per sequence, the CPU kernels on its slot, with the layer's glue
        /// (q/k/v split, L2 norms, gates) as `models/src/model/delta_net.rs` does it.
        fn cpu(&self, seqs: &[RecurrentSequence]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
            let DeltaNetShape { num_key_heads: nk, num_value_heads: nv, key_dim: dk, value_dim: dv, .. } = self.shape;
            let channels = self.channels();
            let (mut conv_state, mut ssm_state) = (self.conv_state.clone(), self.ssm_state.clone());
            let rows = self.qkv_in.len() / channels;
            let mut out = vec![0.0f32; rows * nv * dv];
            let (conv_len, ssm_len) = ((self.kernel - 1) * channels, self.shape.state_len());
            for s in seqs {
                let cs = &mut conv_state[s.slot * conv_len..][..conv_len];
                let ss = &mut ssm_state[s.slot * ssm_len..][..ssm_len];
                if s.fresh {
                    cs.fill(0.0);
                    ss.fill(0.0);
                }
                let r = s.first_row..s.first_row + s.rows;
                let mut mixed = vec![0.0f32; s.rows * channels];
                causal_conv1d_silu(
                    &self.qkv_in[r.start * channels..r.end * channels],
                    &self.conv_w,
                    self.kernel,
                    cs,
                    &mut mixed,
                )
                .unwrap();
                let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
                for row in mixed.chunks_exact(channels) {
                    q.extend_from_slice(&row[..nk * dk]);
                    k.extend_from_slice(&row[nk * dk..2 * nk * dk]);
                    v.extend_from_slice(&row[2 * nk * dk..]);
                }
                l2_normalize(&mut q, dk, 1.0 / (dk as f32).sqrt());
                l2_normalize(&mut k, dk, 1.0);
                let mut g = Vec::new();
                let mut beta = Vec::new();
                for row in r.clone() {
                    for h in 0..nv {
                        g.push(self.neg_rate[h] * softplus(self.a[row * nv + h] + self.dt_bias[h]));
                        beta.push(1.0 / (1.0 + (-self.b[row * nv + h]).exp()));
                    }
                }
                let o = &mut out[r.start * nv * dv..r.end * nv * dv];
                gated_delta_rule(&self.shape, &q, &k, &v, &g, &beta, ss, o).unwrap();
            }
            (out, conv_state, ssm_state)
        }

        /// The device-order model: the two kernels over the whole pass.
        fn device_order(&self, seqs: &[RecurrentSequence]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
            let (mut conv_state, mut ssm_state) = (self.conv_state.clone(), self.ssm_state.clone());
            let mut mixed = vec![0.0f32; self.qkv_in.len()];
            conv(&self.qkv_in, &self.conv_w, self.kernel, &mut conv_state, &mut mixed, seqs).unwrap();
            let rows = self.qkv_in.len() / self.channels();
            let mut out = vec![0.0f32; rows * self.shape.num_value_heads * self.shape.value_dim];
            rule(&self.shape, &mixed, &self.a, &self.b, &self.neg_rate, &self.dt_bias, &mut ssm_state, &mut out, seqs)
                .unwrap();
            (out, conv_state, ssm_state)
        }
    }

    fn close(what: &str, got: &[f32], want: &[f32], tol: f32) -> Result<(), TestCaseError> {
        prop_assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            prop_assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{} [{}]: {} vs {}", what, i, a, b);
        }
        Ok(())
    }

    /// Sequences of `lens` rows in order, in slots taken from the end of the pool, every other
    /// one fresh.
    fn sequences(lens: &[usize], slots: usize) -> Vec<RecurrentSequence> {
        let mut first = 0;
        lens.iter()
            .enumerate()
            .map(|(i, &rows)| {
                let s = RecurrentSequence { first_row: first, rows, slot: slots - 1 - i, fresh: i % 2 == 1 };
                first += rows;
                s
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The device-order model computes what the CPU kernels compute (outputs and both
        /// states), for mixed passes of continuing and fresh sequences, key widths below and at
        /// a kernel's capacity, value widths below, at and past a block, either head order.
        /// Measured difference: below 2e-6 relative; the bound leaves room for 64-token chunks.
        #[test]
        fn device_order_matches_the_cpu_kernels(
            lens in proptest::collection::vec(1usize..20, 1..4),
            dk in prop::sample::select(vec![8usize, 16, 32, 40]),
            dv in prop::sample::select(vec![8usize, 24, 32, 40]),
            kernel in 2usize..=5,
            tiled: bool,
        ) {
            let shape = DeltaNetShape { num_key_heads: 2, num_value_heads: 4, key_dim: dk, value_dim: dv, tiled_value_heads: tiled };
            let rows: usize = lens.iter().sum();
            let slots = lens.len() + 1;
            let pass = Pass::new(shape, kernel, rows, slots);
            let seqs = sequences(&lens, slots);
            let (out, conv_state, ssm_state) = pass.device_order(&seqs);
            let (want_out, want_conv, want_ssm) = pass.cpu(&seqs);
            close("output", &out, &want_out, 2e-5)?;
            close("conv state", &conv_state, &want_conv, 1e-6)?;
            close("SSM state", &ssm_state, &want_ssm, 2e-5)?;
        }

        /// A pass split anywhere into two passes leaves the same outputs and state (bitwise):
        /// what a prefill chunked by the scheduler, or a decode step after it, relies on.
        #[test]
        fn device_order_in_pieces_equals_one_pass(rows in 2usize..24, split in 1usize..23) {
            let split = split.min(rows - 1);
            let shape = DeltaNetShape { num_key_heads: 1, num_value_heads: 2, key_dim: 16, value_dim: 8, tiled_value_heads: false };
            let pass = Pass::new(shape, 4, rows, 1);
            let whole = pass.device_order(&[RecurrentSequence { first_row: 0, rows, slot: 0, fresh: false }]);
            let mut conv_state = pass.conv_state.clone();
            let mut ssm_state = pass.ssm_state.clone();
            let channels = pass.channels();
            let mut out = Vec::new();
            for (a, b) in [(0, split), (split, rows)] {
                let seq = [RecurrentSequence { first_row: 0, rows: b - a, slot: 0, fresh: false }];
                let mut mixed = vec![0.0f32; (b - a) * channels];
                conv(&pass.qkv_in[a * channels..b * channels], &pass.conv_w, 4, &mut conv_state, &mut mixed, &seq).unwrap();
                let mut o = vec![0.0f32; (b - a) * 2 * 8];
                rule(&shape, &mixed, &pass.a[a * 2..b * 2], &pass.b[a * 2..b * 2], &pass.neg_rate, &pass.dt_bias,
                    &mut ssm_state, &mut o, &seq).unwrap();
                out.extend(o);
            }
            prop_assert_eq!(&out, &whole.0);
            prop_assert_eq!(&conv_state, &whole.1);
            prop_assert_eq!(&ssm_state, &whole.2);
        }
    }

    /// Passes the kernels would race on or read past are refused before any launch.
    #[test]
    fn bad_passes_are_refused() {
        let seq = |first_row, rows, slot| RecurrentSequence { first_row, rows, slot, fresh: false };
        assert!(validate_sequences(&[seq(0, 2, 0), seq(2, 3, 1)], 5, 2).is_ok());
        assert!(validate_sequences(&[seq(0, 2, 0), seq(1, 3, 1)], 5, 2).is_err(), "overlapping rows");
        assert!(validate_sequences(&[seq(0, 6, 0)], 5, 2).is_err(), "rows past the pass");
        assert!(validate_sequences(&[seq(0, 2, 2)], 5, 2).is_err(), "slot outside the pool");
        assert!(validate_sequences(&[seq(0, 2, 1), seq(2, 3, 1)], 5, 2).is_err(), "one slot twice");
        assert_eq!(
            (key_capacity(16), key_capacity(128), key_capacity(129), key_capacity(300)),
            (Some(32), Some(128), Some(256), None)
        );
        let mut state = vec![0.0; 6];
        assert!(conv(&[0.0; 3], &[0.0; 21], 7, &mut state, &mut [0.0; 3], &[seq(0, 1, 0)]).is_err(), "width 7");
    }

    /// The butterfly is the sum of all lanes (up to rounding) and every lane ends with it.
    #[test]
    fn butterfly_sums_every_lane() {
        let lanes: [f32; 32] = std::array::from_fn(|i| i as f32);
        assert_eq!(butterfly(lanes), (0..32).sum::<usize>() as f32);
        let v = values(40, 0.5);
        let want: f32 = v.iter().map(|x| x * x).sum();
        assert!((norm_factor(&v, 1.0) - 1.0 / (want + 1e-6).sqrt()).abs() < 1e-6);
    }
}
