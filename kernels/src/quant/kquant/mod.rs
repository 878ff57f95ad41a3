//! K-quant (Q4_K, Q6_K) matrices for the mixture-of-experts MLP: activations quantized to Q8_K
//! once ([`Q8KRows`]) and shared by every matrix they meet, and matrices repacked at load
//! ([`KQuantMatrix`]) so that one call multiplies the rows routed to an expert on the calling
//! thread, with no pool of its own.
//!
//! Why not candle's kernels: candle quantizes the activations again inside every matmul call
//! and splits each call over its thread pool, so a prefill chunk of a 128-expert layer paid
//! hundreds of quantizations and pool barriers per layer (about 32 rows per expert at 512
//! tokens). Here the caller quantizes a layer's input once and runs the experts side by side
//! on its own rayon pool, one expert per task.
//!
//! The arithmetic is ggml's: against Q8_K activations (one f32 scale `dx` per 256 values) a
//! Q4_K block contributes `dx * (Σ_s d·sc_s · Σ q·x - dmin · Σ_s m_s · Σ x)` and a Q6_K block
//! `dx * Σ_s d·sc_s · (Σ q·x - 32 · Σ x)`, the inner sums exact integers. The activation
//! quantization rounds as candle's `BlockQ8K::from_float` does, so the integers are the ones
//! candle's kernels sum; only the order of the float accumulation differs. The AVX-512 VNNI
//! kernel and the portable one fold the integer sums into f32 with the same fused
//! multiply-adds in the same order, so they give bitwise equal results.

use half::f16;
use rayon::prelude::*;

use crate::KernelError;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// Values per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// Bytes per GGML Q4_K block: `d`, `dmin` (f16), 12 bytes of packed 6-bit scales and
/// minimums, 128 bytes of 4-bit values.
pub const Q4_K_BLOCK_BYTES: usize = 4 + 12 + QK_K / 2;

/// Bytes per GGML Q6_K block: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales and
/// an f16 `d`.
pub const Q6_K_BLOCK_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

/// Output rows per tile: one 32-bit lane of a 512-bit register each.
pub(crate) const TILE_ROWS: usize = 16;

/// Activation rows one pass over a weight tile serves (the tile's unpacked values are reused
/// across them).
pub(crate) const MAX_ACT_ROWS: usize = 8;

/// The K-quant formats [`KQuantMatrix`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KQuant {
    /// ggml's `block_q4_K`.
    Q4K,
    /// ggml's `block_q6_K`.
    Q6K,
}

impl KQuant {
    /// Bytes of one GGML block of the format.
    pub fn block_bytes(self) -> usize {
        match self {
            KQuant::Q4K => Q4_K_BLOCK_BYTES,
            KQuant::Q6K => Q6_K_BLOCK_BYTES,
        }
    }
}

/// Whether this CPU runs the fast kernel (AVX-512 F, BW and VNNI). The portable kernel gives
/// the same results, far slower: callers pick another path when this is false.
pub fn kquant_kernel_is_fast() -> bool {
    crate::cpu::has_avx512_vnni()
}

/// One 256-value block of an activation row, quantized to Q8_K, with the sums the formats'
/// offsets need.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct ActBlock {
    /// Values in `-127..=127`.
    pub(crate) qs: [i8; QK_K],
    /// `-32 *` the sum of each 16 values: Q6_K's offset, where its integer sums start.
    pub(crate) neg32_sums16: [i32; 16],
    /// The sum of each 32 values (pairs of them meet Q4_K's minimums in one `vpdpwssd`).
    pub(crate) sums32: [i16; 8],
    /// The scale: value `j` stands for `qs[j] * d`.
    pub(crate) d: f32,
}

impl ActBlock {
    const ZERO: ActBlock = ActBlock { qs: [0; QK_K], neg32_sums16: [0; 16], sums32: [0; 8], d: 0.0 };
}

/// Rows of activations quantized to Q8_K, `k / 256` blocks a row.
#[derive(Clone, Default)]
pub struct Q8KRows {
    k: usize,
    blocks: Vec<ActBlock>,
}

/// Rows per rayon task when quantizing many rows.
const QUANTIZE_ROWS_PER_TASK: usize = 32;

impl Q8KRows {
    /// Quantizes `x`, row-major `[rows, k]`, replacing what the value held (its buffer is
    /// reused); `k` must be a non-zero multiple of 256. Many rows are split over the current
    /// rayon pool.
    pub fn quantize(&mut self, x: &[f32], k: usize) -> Result<(), KernelError> {
        check_k(k)?;
        if !x.len().is_multiple_of(k) {
            return Err(KernelError::RaggedRows { what: "activations", len: x.len(), row_len: k });
        }
        self.k = k;
        self.blocks.clear();
        self.blocks.resize(x.len() / QK_K, ActBlock::ZERO);
        let fast = kquant_kernel_is_fast();
        let work = |(x, blocks): (&[f32], &mut [ActBlock])| {
            for (x, block) in x.chunks_exact(QK_K).zip(blocks) {
                quantize_block(x.try_into().expect("256 values"), block, fast);
            }
        };
        let per_task = QUANTIZE_ROWS_PER_TASK * k;
        if x.len() > per_task {
            x.par_chunks(per_task).zip(self.blocks.par_chunks_mut(per_task / QK_K)).for_each(work);
        } else {
            work((x, &mut self.blocks[..]));
        }
        Ok(())
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        (self.blocks.len() * QK_K).checked_div(self.k).unwrap_or(0)
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Row `r`'s blocks.
    #[inline(always)]
    pub(crate) fn row(&self, r: usize) -> &[ActBlock] {
        let kb = self.k / QK_K;
        &self.blocks[r * kb..(r + 1) * kb]
    }

    /// The f32 values the quantized rows stand for (`q * d`), `[rows, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        self.blocks.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d)).collect()
    }
}

/// Quantizes one block as candle's `BlockQ8K::from_float` does: `iscale = 127 / max|x|`
/// (candle takes the signed value of largest magnitude, which flips the signs of both the
/// values and `d`: the products are the same), values rounded half away from zero, `d = 1 /
/// iscale`. NaNs become 0 and are left out of the maximum.
fn quantize_block(x: &[f32; QK_K], out: &mut ActBlock, fast: bool) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` says the CPU has AVX-512 F and BW.
        unsafe { avx512::quantize_block(x, out) };
        return;
    }
    let _ = fast;
    let amax = x.iter().fold(0.0f32, |a, &v| v.abs().max(a));
    if amax == 0.0 {
        *out = ActBlock::ZERO;
        return;
    }
    let iscale = 127.0 / amax;
    for (q, &v) in out.qs.iter_mut().zip(x) {
        // `as` maps NaN to 0; |v * iscale| <= 127 (rounded) for every finite v.
        *q = (iscale * v).round().clamp(-128.0, 127.0) as i8;
    }
    out.d = 1.0 / iscale;
    finish_sums(out);
}

/// Fills the sums of a block whose values are set.
pub(crate) fn finish_sums(out: &mut ActBlock) {
    let mut sums16 = [0i32; 16];
    for (s, q) in sums16.iter_mut().zip(out.qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i32).sum();
    }
    for (o, s) in out.neg32_sums16.iter_mut().zip(&sums16) {
        *o = -32 * s;
    }
    for (t, o) in out.sums32.iter_mut().enumerate() {
        *o = (sums16[2 * t] + sums16[2 * t + 1]) as i16;
    }
}

/// Checks the inner dimension of a K-quant matmul.
fn check_k(k: usize) -> Result<(), KernelError> {
    if k == 0 || !k.is_multiple_of(QK_K) {
        return Err(KernelError::BadQuantized(format!("k = {k} is not a non-zero multiple of {QK_K}")));
    }
    Ok(())
}

/// One super-block of 16 Q4_K rows.
#[repr(C, align(64))]
#[derive(Clone)]
pub(crate) struct Q4KTile {
    /// At `((4s + g) * 16 + r) * 4 + i`: row `r`'s value `32s + 4g + i` in the low nibble and
    /// `32s + 16 + 4g + i` in the high one (`s` the sub-block, `g` in `0..4`, `i` in `0..4`).
    pub(crate) qs: [u8; QK_K / 2 * TILE_ROWS],
    /// Per sub-block and row: `d * sc`.
    pub(crate) scales: [[f32; TILE_ROWS]; 8],
    /// Per pair of sub-blocks `t`: lane `2r` holds row `r`'s minimum of sub-block `2t`,
    /// lane `2r + 1` that of `2t + 1` (6-bit integers).
    pub(crate) mins: [[i16; 2 * TILE_ROWS]; 4],
    /// Per row: `dmin`.
    pub(crate) dmin: [f32; TILE_ROWS],
}

/// One super-block of 16 Q6_K rows.
#[repr(C, align(64))]
#[derive(Clone)]
pub(crate) struct Q6KTile {
    /// At `((4s + g) * 16 + r) * 4 + i`: row `r`'s value `16s + 4g + i`, in `0..64` (it stands
    /// for the value minus 32).
    pub(crate) qs: [u8; QK_K * TILE_ROWS],
    /// Per sub-block of 16 and row: `d * sc`.
    pub(crate) scales: [[f32; TILE_ROWS]; 16],
}

/// The tiles of a matrix, `[column tile][block]`.
#[derive(Clone)]
enum Tiles {
    Q4K(Vec<Q4KTile>),
    Q6K(Vec<Q6KTile>),
}

/// A weight matrix `[n_out, k]` in Q4_K or Q6_K, repacked for `x @ W^T` (`n_out` a multiple of
/// 16, `k` of 256).
#[derive(Clone)]
pub struct KQuantMatrix {
    n_out: usize,
    k: usize,
    tiles: Tiles,
}

/// Sub-block `j`'s 6-bit scale and minimum from a Q4_K block's 12 packed bytes.
fn q4k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Value `j` (`0..256`) of a Q4_K block's 128 value bytes.
fn q4k_value(qs: &[u8], j: usize) -> u8 {
    (qs[32 * (j / 64) + j % 32] >> (4 * ((j / 32) % 2))) & 0xF
}

/// The 256 values (`0..64`) of a Q6_K block.
fn q6k_values(ql: &[u8], qh: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for half in 0..2 {
        let (ql, qh, q) = (&ql[64 * half..], &qh[32 * half..], &mut q[128 * half..]);
        for l in 0..32 {
            q[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            q[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

impl Q4KTile {
    fn zero() -> Self {
        Q4KTile {
            qs: [0; QK_K / 2 * TILE_ROWS],
            scales: [[0.0; TILE_ROWS]; 8],
            mins: [[0; 2 * TILE_ROWS]; 4],
            dmin: [0.0; TILE_ROWS],
        }
    }

    /// Puts one GGML block in as row `r`.
    fn set_row(&mut self, r: usize, b: &[u8]) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        self.dmin[r] = f16::from_le_bytes([b[2], b[3]]).to_f32();
        for s in 0..8 {
            let (sc, m) = q4k_scale_min(s, &b[4..16]);
            self.scales[s][r] = d * sc as f32;
            self.mins[s / 2][2 * r + s % 2] = m as i16;
        }
        let qs = &b[16..];
        for s in 0..8 {
            for g in 0..4 {
                for i in 0..4 {
                    let j = 32 * s + 4 * g + i;
                    self.qs[((4 * s + g) * TILE_ROWS + r) * 4 + i] = q4k_value(qs, j) | (q4k_value(qs, j + 16) << 4);
                }
            }
        }
    }
}

impl Q6KTile {
    fn zero() -> Self {
        Q6KTile { qs: [0; QK_K * TILE_ROWS], scales: [[0.0; TILE_ROWS]; 16] }
    }

    /// Puts one GGML block in as row `r`.
    fn set_row(&mut self, r: usize, b: &[u8]) {
        let (ql, rest) = b.split_at(QK_K / 2);
        let (qh, rest) = rest.split_at(QK_K / 4);
        let (sc, d) = rest.split_at(QK_K / 16);
        let d = f16::from_le_bytes([d[0], d[1]]).to_f32();
        for (s, &sc) in sc.iter().enumerate() {
            self.scales[s][r] = d * (sc as i8) as f32;
        }
        let q = q6k_values(ql, qh);
        for s in 0..16 {
            for g in 0..4 {
                for i in 0..4 {
                    self.qs[((4 * s + g) * TILE_ROWS + r) * 4 + i] = q[16 * s + 4 * g + i];
                }
            }
        }
    }
}

impl KQuantMatrix {
    /// Reads GGML blocks of `format` (`n_out * k / 256` blocks, row after row), as in a GGUF
    /// file or candle's `QTensor::data()`.
    pub fn from_ggml_bytes(format: KQuant, n_out: usize, k: usize, bytes: &[u8]) -> Result<Self, KernelError> {
        check_k(k)?;
        if n_out == 0 || !n_out.is_multiple_of(TILE_ROWS) {
            return Err(KernelError::BadQuantized(format!(
                "n_out = {n_out} is not a non-zero multiple of {TILE_ROWS}"
            )));
        }
        let kb = k / QK_K;
        let block = format.block_bytes();
        if bytes.len() != n_out * kb * block {
            return Err(KernelError::LengthMismatch {
                what: "K-quant matrix bytes",
                expected: n_out * kb * block,
                actual: bytes.len(),
            });
        }
        let n_tiles = n_out / TILE_ROWS;
        // Tile `(t, b)` holds block `b` of rows `16t..16t + 16`.
        let block_of = |t: usize, b: usize, r: usize| {
            let row = t * TILE_ROWS + r;
            &bytes[(row * kb + b) * block..(row * kb + b + 1) * block]
        };
        let tiles = match format {
            KQuant::Q4K => Tiles::Q4K(
                (0..n_tiles * kb)
                    .map(|i| {
                        let mut tile = Q4KTile::zero();
                        for r in 0..TILE_ROWS {
                            tile.set_row(r, block_of(i / kb, i % kb, r));
                        }
                        tile
                    })
                    .collect(),
            ),
            KQuant::Q6K => Tiles::Q6K(
                (0..n_tiles * kb)
                    .map(|i| {
                        let mut tile = Q6KTile::zero();
                        for r in 0..TILE_ROWS {
                            tile.set_row(r, block_of(i / kb, i % kb, r));
                        }
                        tile
                    })
                    .collect(),
            ),
        };
        Ok(KQuantMatrix { n_out, k, tiles })
    }

    /// Output rows.
    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Inner size.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The format the matrix was read from.
    pub fn format(&self) -> KQuant {
        match self.tiles {
            Tiles::Q4K(_) => KQuant::Q4K,
            Tiles::Q6K(_) => KQuant::Q6K,
        }
    }

    /// `out[i] = x.row(rows[i]) @ W^T`, `out` row-major `[rows.len(), n_out]`, on the calling
    /// thread (callers run matrices side by side).
    pub fn matmul_rows(&self, x: &Q8KRows, rows: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
        if x.k != self.k {
            return Err(KernelError::BadQuantized(format!("activations of {} values for k = {}", x.k, self.k)));
        }
        if out.len() != rows.len() * self.n_out {
            return Err(KernelError::LengthMismatch {
                what: "K-quant matmul output",
                expected: rows.len() * self.n_out,
                actual: out.len(),
            });
        }
        let n_rows = x.rows();
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= n_rows) {
            return Err(KernelError::BadQuantized(format!("activation row {bad} of {n_rows}")));
        }
        let kb = self.k / QK_K;
        let fast = kquant_kernel_is_fast();
        let mut acts: [&[ActBlock]; MAX_ACT_ROWS] = [&[]; MAX_ACT_ROWS];
        for nt in 0..self.n_out / TILE_ROWS {
            for (c, chunk) in rows.chunks(MAX_ACT_ROWS).enumerate() {
                for (a, &r) in acts.iter_mut().zip(chunk) {
                    *a = x.row(r as usize);
                }
                let mut sums = [[0.0f32; TILE_ROWS]; MAX_ACT_ROWS];
                let acts = &acts[..chunk.len()];
                match &self.tiles {
                    Tiles::Q4K(tiles) => q4k_dot(&tiles[nt * kb..(nt + 1) * kb], acts, &mut sums, fast),
                    Tiles::Q6K(tiles) => q6k_dot(&tiles[nt * kb..(nt + 1) * kb], acts, &mut sums, fast),
                }
                for (m, s) in sums[..chunk.len()].iter().enumerate() {
                    let o = (c * MAX_ACT_ROWS + m) * self.n_out + nt * TILE_ROWS;
                    out[o..o + TILE_ROWS].copy_from_slice(s);
                }
            }
        }
        Ok(())
    }
}

/// The 16 rows of one Q4_K column tile (its `kb` blocks) times up to eight activation rows.
fn q4k_dot(tiles: &[Q4KTile], acts: &[&[ActBlock]], out: &mut [[f32; TILE_ROWS]; MAX_ACT_ROWS], fast: bool) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` says the CPU has AVX-512 F, BW and VNNI.
        unsafe { avx512::q4k_dot(tiles, acts, out) };
        return;
    }
    let _ = fast;
    portable_dot(tiles, acts, out, |tile, a, r| {
        let mut part = 0.0f32;
        for s in 0..8 {
            let mut isum = 0i32;
            for g in 0..4 {
                for i in 0..4 {
                    let byte = tile.qs[((4 * s + g) * TILE_ROWS + r) * 4 + i];
                    isum += (byte & 0xF) as i32 * a.qs[32 * s + 4 * g + i] as i32;
                    isum += (byte >> 4) as i32 * a.qs[32 * s + 16 + 4 * g + i] as i32;
                }
            }
            part = (isum as f32).mul_add(tile.scales[s][r], part);
        }
        let mut msum = 0i32;
        for s in 0..8 {
            msum += tile.mins[s / 2][2 * r + s % 2] as i32 * a.sums32[s] as i32;
        }
        (-(msum as f32)).mul_add(tile.dmin[r], part)
    });
}

/// The 16 rows of one Q6_K column tile (its `kb` blocks) times up to eight activation rows.
fn q6k_dot(tiles: &[Q6KTile], acts: &[&[ActBlock]], out: &mut [[f32; TILE_ROWS]; MAX_ACT_ROWS], fast: bool) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` says the CPU has AVX-512 F, BW and VNNI.
        unsafe { avx512::q6k_dot(tiles, acts, out) };
        return;
    }
    let _ = fast;
    portable_dot(tiles, acts, out, |tile, a, r| {
        let mut part = 0.0f32;
        for s in 0..16 {
            let mut isum = a.neg32_sums16[s];
            for g in 0..4 {
                for i in 0..4 {
                    let v = tile.qs[((4 * s + g) * TILE_ROWS + r) * 4 + i];
                    isum += v as i32 * a.qs[16 * s + 4 * g + i] as i32;
                }
            }
            part = (isum as f32).mul_add(tile.scales[s][r], part);
        }
        part
    });
}

/// The portable kernels' outer loops: every activation row against each of the tile's rows,
/// `block(tile, act, row)` per block scaled by the activation block's `d`, in the order the
/// AVX-512 kernels add them (so both give the same bits).
fn portable_dot<T>(
    tiles: &[T],
    acts: &[&[ActBlock]],
    out: &mut [[f32; TILE_ROWS]; MAX_ACT_ROWS],
    block: impl Fn(&T, &ActBlock, usize) -> f32,
) {
    for (m, act) in acts.iter().enumerate() {
        for (r, slot) in out[m].iter_mut().enumerate() {
            *slot = tiles.iter().zip(act.iter()).fold(0.0f32, |acc, (tile, a)| block(tile, a, r).mul_add(a.d, acc));
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]`: the SwiGLU of an MLP's two projections, with the
/// vectorizing `exp` of the attention kernels (a few ulp from libm's).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up projections of different sizes");
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx512f() {
        // SAFETY: the CPU has AVX-512 F.
        unsafe { avx512::swiglu(gate, up) };
        return;
    }
    swiglu_portable(gate, up);
}

/// [`swiglu`] in portable code (the body the AVX-512 build vectorizes).
#[inline(always)]
pub(crate) fn swiglu_portable(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + crate::vector::exp_approx(-*g)) * u;
    }
}

#[cfg(test)]
mod tests;
