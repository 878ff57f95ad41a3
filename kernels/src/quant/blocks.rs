//! GGML's block formats as they lie in a GGUF file, read in place: each type's geometry and
//! the scalar decoding of one block (its integer values, scales and minimums), which the
//! portable dot products and the dequantization share.

use half::f16;

/// A GGML quantization type our CPU kernels multiply by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // GGML's own names
pub enum QuantType {
    /// `block_q4_0`: `d`, 32 4-bit values; `w = d * (q - 8)`.
    Q4_0,
    /// `block_q4_1`: `d`, `m`, 32 4-bit values; `w = d * q + m`.
    Q4_1,
    /// `block_q5_0`: `d`, 32 high bits, 32 4-bit values; `w = d * (q - 16)`.
    Q5_0,
    /// `block_q5_1`: `d`, `m`, 32 high bits, 32 4-bit values; `w = d * q + m`.
    Q5_1,
    /// `block_q8_0`: `d`, 32 int8 values; `w = d * q`.
    Q8_0,
    /// `block_q4_K`: super-blocks of 256 in 8 sub-blocks of 32 with 6-bit scales and minimums.
    Q4_K,
    /// `block_q5_K`: as Q4_K with a fifth bit per value.
    Q5_K,
    /// `block_q6_K`: 16 sub-blocks of 16 with int8 scales, 6-bit values offset by 32.
    Q6_K,
}

/// Values per block of the 32-value types.
pub const QK8_0: usize = 32;

/// Values per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// Bytes per GGML Q8_0 block: an f16 scale, then 32 int8 values.
pub const Q8_0_BLOCK_BYTES: usize = 2 + QK8_0;

/// Which activation quantization a weight type's dot product reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    /// Blocks of 32 int8 values with an f32 scale and their sum (ggml's Q8_0 / Q8_1).
    Q8_0,
    /// Blocks of 256 int8 values with an f32 scale and sums of each 16 (ggml's Q8_K).
    Q8K,
}

impl QuantType {
    /// Every type, in GGML's order.
    pub const ALL: [QuantType; 8] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
    ];

    /// The type of a GGML type id (`ggml_type`), if we have kernels for it.
    pub fn from_ggml_id(id: u32) -> Option<QuantType> {
        Some(match id {
            2 => QuantType::Q4_0,
            3 => QuantType::Q4_1,
            6 => QuantType::Q5_0,
            7 => QuantType::Q5_1,
            8 => QuantType::Q8_0,
            12 => QuantType::Q4_K,
            13 => QuantType::Q5_K,
            14 => QuantType::Q6_K,
            _ => return None,
        })
    }

    /// GGML's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4_K => "Q4_K",
            QuantType::Q5_K => "Q5_K",
            QuantType::Q6_K => "Q6_K",
        }
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self.act_format() {
            ActFormat::Q8_0 => QK8_0,
            ActFormat::Q8K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q4_0 => 2 + 16,
            QuantType::Q4_1 => 4 + 16,
            QuantType::Q5_0 => 2 + 4 + 16,
            QuantType::Q5_1 => 4 + 4 + 16,
            QuantType::Q8_0 => Q8_0_BLOCK_BYTES,
            QuantType::Q4_K => 4 + 12 + 128,
            QuantType::Q5_K => 4 + 12 + 32 + 128,
            QuantType::Q6_K => 128 + 64 + 16 + 2,
        }
    }

    /// The activation quantization its dot product reads.
    pub fn act_format(self) -> ActFormat {
        match self {
            QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K => ActFormat::Q8K,
            _ => ActFormat::Q8_0,
        }
    }

    /// Bytes of a row of `k` values (`k` a multiple of the block size).
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block_values() * self.block_bytes()
    }
}

/// The f16 at `b[i..i + 2]`, as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// A block of a 32-value type, decoded: `w_j = d * (q_j - offset) + m`.
pub(crate) struct Block32 {
    /// The values as stored (Q8_0: signed; the others: `0..16` or `0..32`).
    pub(crate) q: [i8; QK8_0],
    pub(crate) d: f32,
    /// Q4_1 and Q5_1's minimum; 0 for the others.
    pub(crate) m: f32,
    /// Subtracted from every value: 8 (Q4_0), 16 (Q5_0), else 0.
    pub(crate) offset: i32,
}

impl Block32 {
    /// The block's values in f32, as GGML's `dequantize_row_*` gives them.
    pub(crate) fn dequantize_into(&self, out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(&self.q) {
            *o = (q as i32 - self.offset) as f32 * self.d + self.m;
        }
    }
}

/// Decodes block `b` of a 32-value type (`b` exactly one block's bytes).
pub(crate) fn block32(ty: QuantType, b: &[u8]) -> Block32 {
    let mut q = [0i8; QK8_0];
    let nibbles = |q: &mut [i8; QK8_0], qs: &[u8]| {
        for (j, &v) in qs.iter().enumerate() {
            q[j] = (v & 0xF) as i8;
            q[j + 16] = (v >> 4) as i8;
        }
    };
    let high_bits = |q: &mut [i8; QK8_0], qh: &[u8]| {
        let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        for (j, q) in q.iter_mut().enumerate() {
            *q |= (((qh >> j) & 1) << 4) as i8;
        }
    };
    let (m, offset) = match ty {
        QuantType::Q4_0 => {
            nibbles(&mut q, &b[2..18]);
            (0.0, 8)
        }
        QuantType::Q4_1 => {
            nibbles(&mut q, &b[4..20]);
            (f16_at(b, 2), 0)
        }
        QuantType::Q5_0 => {
            nibbles(&mut q, &b[6..22]);
            high_bits(&mut q, &b[2..6]);
            (0.0, 16)
        }
        QuantType::Q5_1 => {
            nibbles(&mut q, &b[8..24]);
            high_bits(&mut q, &b[4..8]);
            (f16_at(b, 2), 0)
        }
        QuantType::Q8_0 => {
            for (q, &v) in q.iter_mut().zip(&b[2..34]) {
                *q = v as i8;
            }
            (0.0, 0)
        }
        _ => unreachable!("{ty:?} is not a 32-value type"),
    };
    Block32 { q, d: f16_at(b, 0), m, offset }
}

/// A K-quant super-block, decoded: `w_j = d * sc_s * (q_j - offset) - dmin * m_s` for `j` in
/// sub-block `s` (16 values for Q6_K, 32 for Q4_K and Q5_K).
pub(crate) struct BlockK {
    /// Values as stored: `0..16` (Q4_K), `0..32` (Q5_K), `0..64` (Q6_K).
    pub(crate) q: [u8; QK_K],
    /// Sub-block scales: 8 (6-bit) for Q4_K/Q5_K, 16 (int8) for Q6_K.
    pub(crate) sc: [i32; 16],
    /// Sub-block minimums (6-bit), Q4_K/Q5_K only.
    pub(crate) m: [i32; 8],
    pub(crate) d: f32,
    pub(crate) dmin: f32,
}

impl BlockK {
    /// The block's values in f32 (`ty` the block's type), as GGML's `dequantize_row_*` gives
    /// them.
    pub(crate) fn dequantize_into(&self, ty: QuantType, out: &mut [f32]) {
        if ty == QuantType::Q6_K {
            for (j, o) in out.iter_mut().enumerate() {
                *o = self.d * self.sc[j / 16] as f32 * (self.q[j] as i32 - 32) as f32;
            }
        } else {
            for (j, o) in out.iter_mut().enumerate() {
                let s = j / 32;
                *o = self.d * self.sc[s] as f32 * self.q[j] as f32 - self.dmin * self.m[s] as f32;
            }
        }
    }
}

/// Sub-block `j`'s 6-bit scale and minimum from a Q4_K/Q5_K block's 12 packed bytes.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Decodes a K-quant super-block (`b` exactly one block's bytes).
pub(crate) fn block_k(ty: QuantType, b: &[u8]) -> BlockK {
    let mut out = BlockK { q: [0; QK_K], sc: [0; 16], m: [0; 8], d: 0.0, dmin: 0.0 };
    match ty {
        QuantType::Q4_K | QuantType::Q5_K => {
            out.d = f16_at(b, 0);
            out.dmin = f16_at(b, 2);
            for s in 0..8 {
                let (sc, m) = scale_min_k4(s, &b[4..16]);
                out.sc[s] = sc as i32;
                out.m[s] = m as i32;
            }
            let (qh, qs) = if ty == QuantType::Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            // Chunk `c` of 32 bytes holds values 64c..64c+32 in its low nibbles and
            // 64c+32..64c+64 in its high ones; Q5_K's bit 2c (2c + 1) of `qh[l]` is value
            // 64c + l's (64c + 32 + l's) fifth bit.
            for c in 0..4 {
                for l in 0..32 {
                    let (lo, hi) = (qs[32 * c + l] & 0xF, qs[32 * c + l] >> 4);
                    let (hlo, hhi) = match qh {
                        Some(qh) => (((qh[l] >> (2 * c)) & 1) << 4, ((qh[l] >> (2 * c + 1)) & 1) << 4),
                        None => (0, 0),
                    };
                    out.q[64 * c + l] = lo | hlo;
                    out.q[64 * c + 32 + l] = hi | hhi;
                }
            }
        }
        QuantType::Q6_K => {
            let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
            out.d = f16_at(b, 208);
            for (o, &s) in out.sc.iter_mut().zip(sc) {
                *o = s as i8 as i32;
            }
            for half in 0..2 {
                let (ql, qh, q) = (&ql[64 * half..], &qh[32 * half..], &mut out.q[128 * half..]);
                for l in 0..32 {
                    q[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                    q[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                    q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                    q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                }
            }
        }
        _ => unreachable!("{ty:?} is not a K-quant"),
    }
    out
}

/// Row `row` of values (`k` of them, `bytes` exactly that row's blocks) in f32, as GGML's
/// `dequantize_row_*` gives them.
pub(crate) fn dequantize_row(ty: QuantType, bytes: &[u8], out: &mut [f32]) {
    let bb = ty.block_bytes();
    match ty.act_format() {
        ActFormat::Q8_0 => {
            for (b, out) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(QK8_0)) {
                block32(ty, b).dequantize_into(out);
            }
        }
        ActFormat::Q8K => {
            for (b, out) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
                block_k(ty, b).dequantize_into(ty, out);
            }
        }
    }
}
