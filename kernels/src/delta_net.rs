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

pub mod device_order;

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

    pub(crate) fn validate(&self) -> Result<(), KernelError> {
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

/// Value columns of the state swept together: one AVX-512 register of f32.
const COLUMNS: usize = 16;

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
    // Tap-major weights, so each tap's product runs along contiguous channels.
    let taps: Vec<f32> = (0..kernel).flat_map(|tap| (0..channels).map(move |c| weight[c * kernel + tap])).collect();
    for t in 0..rows {
        let o = &mut out[t * channels..(t + 1) * channels];
        o.fill(0.0);
        for tap in 0..kernel {
            multiply_add(o, &taps[tap * channels..(tap + 1) * channels], input(t, tap));
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

/// `out += a * b`, elementwise, vectorized for the CPU at hand.
fn multiply_add(out: &mut [f32], a: &[f32], b: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512f() {
            // SAFETY: the CPU has AVX-512F, the only feature the function enables.
            return unsafe { multiply_add_avx512(out, a, b) };
        }
        if crate::cpu::has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA, the only features the function enables.
            return unsafe { multiply_add_avx2(out, a, b) };
        }
    }
    multiply_add_portable(out, a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn multiply_add_avx512(out: &mut [f32], a: &[f32], b: &[f32]) {
    multiply_add_portable(out, a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn multiply_add_avx2(out: &mut [f32], a: &[f32], b: &[f32]) {
    multiply_add_portable(out, a, b)
}

#[inline(always)]
fn multiply_add_portable(out: &mut [f32], a: &[f32], b: &[f32]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o += x * y;
    }
}

/// The inputs of [`gated_delta_rule`], checked, for one head's sweep.
struct RuleInputs<'a> {
    shape: DeltaNetShape,
    rows: usize,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

/// One value head through every token: its state `s` (`[key_dim, value_dim]`) updated in
/// place, its outputs written to `out` (`[rows, value_dim]`). The loops are written so the
/// compiler vectorizes them; compiled again with AVX-512 or AVX2 + FMA where the CPU has them
/// (the default x86-64 target has neither, and SSE2 ran this at a tenth of the speed).
fn sweep_head(inputs: &RuleInputs, h: usize, s: &mut [f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512f() {
            // SAFETY: the CPU has AVX-512F, the only feature the function enables.
            return unsafe { sweep_head_avx512(inputs, h, s, out) };
        }
        if crate::cpu::has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA, the only features the function enables.
            return unsafe { sweep_head_avx2(inputs, h, s, out) };
        }
    }
    sweep_head_portable(inputs, h, s, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sweep_head_avx512(inputs: &RuleInputs, h: usize, s: &mut [f32], out: &mut [f32]) {
    sweep_head_portable(inputs, h, s, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sweep_head_avx2(inputs: &RuleInputs, h: usize, s: &mut [f32], out: &mut [f32]) {
    sweep_head_portable(inputs, h, s, out)
}

#[inline(always)]
fn sweep_head_portable(inputs: &RuleInputs, h: usize, s: &mut [f32], out: &mut [f32]) {
    let RuleInputs { shape, rows, q, k, v, g, beta } = *inputs;
    let DeltaNetShape { num_key_heads, num_value_heads, key_dim, value_dim, .. } = shape;
    let kh = shape.key_head_of(h);
    if rows < BLOCKED_FROM_ROWS {
        return sweep_rows(inputs, h, kh, s, out);
    }
    // Each value column's recurrence reads and writes only that column of the state, so the
    // state is swept a block of columns at a time through every token: the block's rows
    // (key_dim lines of 64 bytes, 8 KiB for 128 keys) stay in L1, where sweeping the whole
    // 64 KiB state twice per token ran from L2. The arithmetic per column, and its order, is
    // the same either way.
    for j0 in (0..value_dim).step_by(COLUMNS) {
        let width = COLUMNS.min(value_dim - j0);
        for t in 0..rows {
            let qt = &q[(t * num_key_heads + kh) * key_dim..][..key_dim];
            let kt = &k[(t * num_key_heads + kh) * key_dim..][..key_dim];
            let vt = &v[(t * num_value_heads + h) * value_dim + j0..][..width];
            let decay = g[t * num_value_heads + h].exp();
            let b = beta[t * num_value_heads + h];
            let mut delta = [0.0f32; COLUMNS];
            let mut o = [0.0f32; COLUMNS];
            // Full blocks as fixed-size arrays, which the compiler keeps in registers (the slice
            // form alone prefilled the 0.8B shape's 512 tokens at 191-194 tok/s, this at 203-209).
            if width == COLUMNS {
                // delta = beta (v - (decay S)^T k); then S = decay S + k delta^T, out = S^T q.
                for (i, &ki) in kt.iter().enumerate() {
                    let row: &[f32; COLUMNS] = s[i * value_dim + j0..][..COLUMNS].try_into().expect("a full block");
                    for c in 0..COLUMNS {
                        delta[c] += ki * row[c];
                    }
                }
                for c in 0..COLUMNS {
                    delta[c] = (vt[c] - decay * delta[c]) * b;
                }
                for (i, (&ki, &qi)) in kt.iter().zip(qt).enumerate() {
                    let row: &mut [f32; COLUMNS] =
                        (&mut s[i * value_dim + j0..][..COLUMNS]).try_into().expect("a full block");
                    for c in 0..COLUMNS {
                        row[c] = decay * row[c] + ki * delta[c];
                        o[c] += qi * row[c];
                    }
                }
            } else {
                for (i, &ki) in kt.iter().enumerate() {
                    for (d, &sij) in delta.iter_mut().zip(&s[i * value_dim + j0..][..width]) {
                        *d += ki * sij;
                    }
                }
                for (d, &vj) in delta.iter_mut().zip(vt) {
                    *d = (vj - decay * *d) * b;
                }
                for (i, (&ki, &qi)) in kt.iter().zip(qt).enumerate() {
                    let row = &mut s[i * value_dim + j0..][..width];
                    for ((sij, &d), oj) in row.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
                        *sij = decay * *sij + ki * d;
                        *oj += qi * *sij;
                    }
                }
            }
            out[t * value_dim + j0..][..width].copy_from_slice(&o[..width]);
        }
    }
}

/// Fewer tokens than this (decode steps) sweep whole state rows: a block of columns pays off
/// only when several tokens reuse it, and with one token the whole-row sweep reads the state
/// (from memory, in decode) in order, which a strided block sweep does not.
const BLOCKED_FROM_ROWS: usize = 4;

/// [`sweep_head_portable`] a token at a time over whole rows of the state.
#[inline(always)]
fn sweep_rows(inputs: &RuleInputs, h: usize, kh: usize, s: &mut [f32], out: &mut [f32]) {
    let RuleInputs { shape, rows, q, k, v, g, beta } = *inputs;
    let DeltaNetShape { num_key_heads, num_value_heads, key_dim, value_dim, .. } = shape;
    let mut delta = vec![0.0f32; value_dim];
    for t in 0..rows {
        let qt = &q[(t * num_key_heads + kh) * key_dim..][..key_dim];
        let kt = &k[(t * num_key_heads + kh) * key_dim..][..key_dim];
        let vt = &v[(t * num_value_heads + h) * value_dim..][..value_dim];
        let decay = g[t * num_value_heads + h].exp();
        let b = beta[t * num_value_heads + h];
        delta.fill(0.0);
        for (row, &ki) in s.chunks_exact(value_dim).zip(kt) {
            for (d, &sij) in delta.iter_mut().zip(row) {
                *d += ki * sij;
            }
        }
        for (d, &vj) in delta.iter_mut().zip(vt) {
            *d = (vj - decay * *d) * b;
        }
        let o = &mut out[t * value_dim..(t + 1) * value_dim];
        o.fill(0.0);
        for (row, (&ki, &qi)) in s.chunks_exact_mut(value_dim).zip(kt.iter().zip(qt)) {
            for ((sij, &d), oj) in row.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
                *sij = decay * *sij + ki * d;
                *oj += qi * *sij;
            }
        }
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Scales each `dim`-wide head of `x` to unit L2 norm (with transformers' epsilon), times
/// `scale`: `x / sqrt(sum x^2 + 1e-6)`, as transformers and the FLA kernels it follows.
pub fn l2_normalize(x: &mut [f32], dim: usize, scale: f32) {
    for head in x.chunks_exact_mut(dim) {
        let sum: f32 = head.iter().map(|v| v * v).sum();
        let factor = scale / (sum + 1e-6).sqrt();
        for v in head {
            *v *= factor;
        }
    }
}

/// `ln(1 + e^x)`, linear above 20 as torch's softplus.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
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
    let inputs = RuleInputs::checked(shape, q, k, v, g, beta, state.len(), out.len())?;
    let (key_dim, value_dim) = (shape.key_dim, shape.value_dim);
    let head_outputs: Vec<Vec<f32>> = state
        .par_chunks_exact_mut(key_dim * value_dim)
        .enumerate()
        .map(|(h, s)| {
            let mut head_out = vec![0.0f32; inputs.rows * value_dim];
            sweep_head(&inputs, h, s, &mut head_out);
            head_out
        })
        .collect();
    inputs.gather(&head_outputs, out);
    Ok(())
}

/// [`gated_delta_rule`] over a drafted span being verified: `state` advances over the first
/// `kept` rows (tokens already accepted) and is only read for the rest (drafts that may yet be
/// rejected, after which the state must be where the accepted ones leave it). Each head goes on
/// from its updated matrix in a private copy (64 KiB for 128 x 128) while that is in cache, so
/// the pool's state is read once; the arithmetic and its order are [`gated_delta_rule`]'s, so
/// the outputs are bitwise its outputs over all the rows.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule_verify(
    shape: &DeltaNetShape,
    kept: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let inputs = RuleInputs::checked(shape, q, k, v, g, beta, state.len(), out.len())?;
    if kept > inputs.rows {
        return Err(KernelError::LengthMismatch { what: "kept rows", expected: inputs.rows, actual: kept });
    }
    let (first, rest) = inputs.split(kept);
    let (key_dim, value_dim) = (shape.key_dim, shape.value_dim);
    let head_outputs: Vec<(Vec<f32>, Vec<f32>)> = state
        .par_chunks_exact_mut(key_dim * value_dim)
        .enumerate()
        .map(|(h, s)| {
            let mut first_out = vec![0.0f32; first.rows * value_dim];
            sweep_head(&first, h, s, &mut first_out);
            let mut working = s.to_vec();
            let mut rest_out = vec![0.0f32; rest.rows * value_dim];
            sweep_head(&rest, h, &mut working, &mut rest_out);
            (first_out, rest_out)
        })
        .collect();
    let (first_outputs, rest_outputs): (Vec<_>, Vec<_>) = head_outputs.into_iter().unzip();
    let (out_first, out_rest) = out.split_at_mut(kept * shape.num_value_heads * value_dim);
    first.gather(&first_outputs, out_first);
    rest.gather(&rest_outputs, out_rest);
    Ok(())
}

impl<'a> RuleInputs<'a> {
    /// The inputs of one call, their lengths checked against `shape` and each other.
    #[allow(clippy::too_many_arguments)]
    fn checked(
        shape: &DeltaNetShape,
        q: &'a [f32],
        k: &'a [f32],
        v: &'a [f32],
        g: &'a [f32],
        beta: &'a [f32],
        state_len: usize,
        out_len: usize,
    ) -> Result<Self, KernelError> {
        shape.validate()?;
        let DeltaNetShape { num_key_heads, num_value_heads, key_dim, value_dim, .. } = *shape;
        let rows = g.len() / num_value_heads;
        check_len("gate", g.len(), rows * num_value_heads)?;
        check_len("beta", beta.len(), rows * num_value_heads)?;
        check_len("query", q.len(), rows * num_key_heads * key_dim)?;
        check_len("key", k.len(), rows * num_key_heads * key_dim)?;
        check_len("value", v.len(), rows * num_value_heads * value_dim)?;
        check_len("output", out_len, rows * num_value_heads * value_dim)?;
        check_len("state", state_len, shape.state_len())?;
        Ok(RuleInputs { shape: *shape, rows, q, k, v, g, beta })
    }

    /// The first `rows` rows, and the rest.
    fn split(&self, rows: usize) -> (Self, Self) {
        let DeltaNetShape { num_key_heads, num_value_heads, key_dim, value_dim, .. } = self.shape;
        let (qk, vv, hv) = (num_key_heads * key_dim, num_value_heads * value_dim, num_value_heads);
        let part = |from: usize, to: usize| RuleInputs {
            shape: self.shape,
            rows: to - from,
            q: &self.q[from * qk..to * qk],
            k: &self.k[from * qk..to * qk],
            v: &self.v[from * vv..to * vv],
            g: &self.g[from * hv..to * hv],
            beta: &self.beta[from * hv..to * hv],
        };
        (part(0, rows), part(rows, self.rows))
    }

    /// Interleaves the heads' outputs (`[rows, value_dim]` each) into `out`
    /// (`[rows, value heads * value_dim]`).
    fn gather(&self, head_outputs: &[Vec<f32>], out: &mut [f32]) {
        let DeltaNetShape { num_value_heads, value_dim, .. } = self.shape;
        for (h, head_out) in head_outputs.iter().enumerate() {
            for t in 0..self.rows {
                out[(t * num_value_heads + h) * value_dim..][..value_dim]
                    .copy_from_slice(&head_out[t * value_dim..(t + 1) * value_dim]);
            }
        }
    }
}

#[cfg(test)]
mod tests;
