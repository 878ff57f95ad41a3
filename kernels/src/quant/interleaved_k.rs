//! The interleaved layout of the K-quants (see [`super::interleaved`] for the idea): sixteen
//! rows' super-blocks side by side, four neighbouring values of each row per 64-byte chunk, and
//! the per-row scales stored so that one 16-byte load holds one byte of each row. Each group
//! block is sixteen of the file's blocks, bit for bit rearranged:
//!
//! - Q4_K (2,304 bytes): `d` (16 f16), `dmin` (16 f16), the 12 packed scale bytes transposed
//!   (byte `i` of row `r` at `64 + 16i + r`), then 32 chunks of `qs`: chunk `i` holds each row's
//!   bytes `4i..4i + 4`, whose low nibbles are values `64c + l` and high nibbles `64c + 32 + l`
//!   (`c = i / 8`, `l = 4 (i % 8) + j`).
//! - Q5_K (2,816 bytes): as Q4_K, with the fifth bits between scales and values: per chunk `i`
//!   two u64 masks (low nibbles' values, then high nibbles'), bit `4r + j` for row `r`.
//! - Q6_K (3,360 bytes): `d` (16 f16), the 16 int8 scales transposed (scale `s` of row `r` at
//!   `32 + 16s + r`), 32 chunks of `ql` (row bytes `4i..4i + 4`), 16 chunks of `qh` (the same).

use super::blocks::{BlockK, QuantType, block_k};

/// Rows per group.
const ROWS: usize = super::interleaved::GROUP_ROWS;

/// Where a K-quant group block's parts lie, in bytes from its start.
#[derive(Clone, Copy)]
pub(crate) struct PartsK {
    /// Scales (and, Q4_K/Q5_K, minimums): 12 packed bytes, or 16 int8, per row, transposed.
    pub(crate) scales: usize,
    /// Q5_K's fifth-bit masks, two u64 per chunk.
    pub(crate) qh: usize,
    /// The low bits: 32 chunks of 64 bytes.
    pub(crate) qs: usize,
    /// Q6_K's high bits: 16 chunks of 64 bytes.
    pub(crate) q6h: usize,
    /// The whole group block.
    pub(crate) bytes: usize,
}

/// The parts of a K-quant's group block.
pub(crate) const fn parts_k(ty: QuantType) -> PartsK {
    match ty {
        QuantType::Q4_K => PartsK { scales: 64, qh: 256, qs: 256, q6h: 0, bytes: 2304 },
        QuantType::Q5_K => PartsK { scales: 64, qh: 256, qs: 768, q6h: 0, bytes: 2816 },
        _ => PartsK { scales: 32, qh: 0, qs: 288, q6h: 2336, bytes: 3360 },
    }
}

/// Writes `src` (one of the file's blocks of `ty`) as row `r` of group block `gb`.
pub(crate) fn put(ty: QuantType, src: &[u8], gb: &mut [u8], r: usize) {
    let p = parts_k(ty);
    let chunk = |gb: &mut [u8], at: usize, i: usize, from: &[u8]| {
        gb[at + 64 * i + 4 * r..at + 64 * i + 4 * r + 4].copy_from_slice(&from[4 * i..4 * i + 4]);
    };
    match ty {
        QuantType::Q6_K => {
            gb[2 * r..2 * r + 2].copy_from_slice(&src[208..210]);
            for s in 0..16 {
                gb[p.scales + 16 * s + r] = src[192 + s];
            }
            for i in 0..32 {
                chunk(gb, p.qs, i, &src[..128]);
            }
            for t in 0..16 {
                chunk(gb, p.q6h, t, &src[128..192]);
            }
        }
        _ => {
            gb[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
            gb[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&src[2..4]);
            for i in 0..12 {
                gb[p.scales + 16 * i + r] = src[4 + i];
            }
            let qs = if ty == QuantType::Q5_K { &src[48..176] } else { &src[16..144] };
            for i in 0..32 {
                chunk(gb, p.qs, i, qs);
            }
            if ty == QuantType::Q5_K {
                let qh = &src[16..48];
                for i in 0..32 {
                    let c = i / 8;
                    for j in 0..4 {
                        let l = 4 * (i % 8) + j;
                        let bit = 4 * r + j;
                        for (half, shift) in [(0, 2 * c), (1, 2 * c + 1)] {
                            let at = p.qh + 16 * i + 8 * half + bit / 8;
                            gb[at] |= ((qh[l] >> shift) & 1) << (bit % 8);
                        }
                    }
                }
            }
        }
    }
}

/// Row `r` of group block `gb` as the file's block of `ty` (the inverse of [`put`]).
fn take(ty: QuantType, gb: &[u8], r: usize) -> [u8; 210] {
    let p = parts_k(ty);
    let mut out = [0u8; 210];
    let chunk = |out: &mut [u8], at: usize, i: usize| {
        out[4 * i..4 * i + 4].copy_from_slice(&gb[at + 64 * i + 4 * r..at + 64 * i + 4 * r + 4]);
    };
    match ty {
        QuantType::Q6_K => {
            out[208..210].copy_from_slice(&gb[2 * r..2 * r + 2]);
            for s in 0..16 {
                out[192 + s] = gb[p.scales + 16 * s + r];
            }
            for i in 0..32 {
                chunk(&mut out[..128], p.qs, i);
            }
            for t in 0..16 {
                chunk(&mut out[128..192], p.q6h, t);
            }
        }
        _ => {
            out[..2].copy_from_slice(&gb[2 * r..2 * r + 2]);
            out[2..4].copy_from_slice(&gb[32 + 2 * r..32 + 2 * r + 2]);
            for i in 0..12 {
                out[4 + i] = gb[p.scales + 16 * i + r];
            }
            let qs_at = if ty == QuantType::Q5_K { 48 } else { 16 };
            for i in 0..32 {
                chunk(&mut out[qs_at..qs_at + 128], p.qs, i);
            }
            if ty == QuantType::Q5_K {
                for i in 0..32 {
                    let c = i / 8;
                    for j in 0..4 {
                        let l = 4 * (i % 8) + j;
                        let bit = 4 * r + j;
                        for (half, shift) in [(0, 2 * c), (1, 2 * c + 1)] {
                            let set = (gb[p.qh + 16 * i + 8 * half + bit / 8] >> (bit % 8)) & 1;
                            out[16 + l] |= set << shift;
                        }
                    }
                }
            }
        }
    }
    out
}

/// Super-block `b`'s row `r` (of the group whose bytes are `group`), decoded.
pub(crate) fn block(ty: QuantType, group: &[u8], b: usize, r: usize) -> BlockK {
    let p = parts_k(ty);
    let block = take(ty, &group[b * p.bytes..(b + 1) * p.bytes], r);
    block_k(ty, &block[..ty.block_bytes()])
}

const _: () = assert!(parts_k(QuantType::Q4_K).bytes == ROWS * 144);
const _: () = assert!(parts_k(QuantType::Q5_K).bytes == ROWS * 176);
const _: () = assert!(parts_k(QuantType::Q6_K).bytes == ROWS * 210);
