//! The interleaved layout of the 32-value types: a matrix's rows repacked once, at load, in
//! groups of sixteen, so that one vector load holds four neighbouring values of each of sixteen
//! (or, in 256-bit halves, eight) rows and one `vpdpbusd` adds four products into each row's own
//! lane: the exact per-block integer sums come out one per lane, with no horizontal reduction.
//! The in-place kernels spend most of their time on that reduction (a tile's eight row sums are
//! folded together by `hadd` trees, block after block); this layout is what llama.cpp's
//! repacked `block_q8_0x8`-style kernels and our own pre-e3b8752 Q8_0 kernel did, kept lossless
//! and the same size as the file's blocks, so the file's pages can be dropped after the repack.
//!
//! A group of 16 rows is `nb` group blocks in order, each holding block `b` of its 16 rows:
//!
//! - `d`: 16 f16 scales (row `r` at bytes `2r..2r + 2`);
//! - `m`: 16 f16 minimums (Q4_1, Q5_1);
//! - `qh`: 8 little-endian u64 (Q5_0, Q5_1): bit `4r + i` of word `c` is the fifth bit of value
//!   `4c + i` of row `r`;
//! - `qs`, in 64-byte chunks, row `r`'s four bytes at `4r..4r + 4` of each chunk: for Q8_0 eight
//!   chunks, chunk `c` the int8 values `4c..4c + 4`; for the 4- and 5-bit types four chunks,
//!   chunk `c` the file's nibble bytes `4c..4c + 4`, whose low nibbles are values `4c..4c + 4`
//!   and high nibbles values `16 + 4c..16 + 4c + 4`.
//!
//! The K-quants have a layout of the same kind ([`super::interleaved_k`]). A last group past the
//! matrix's rows repeats its last row; those lanes are never stored. The dot products are those
//! of [`super::portable`] (the same exact integer sums and f32 steps), so every result is
//! bitwise the in-place kernels'.

use rayon::prelude::*;

use super::acts::Q8Row;
use super::blocks::{ActFormat, Block32, QK8_0, QuantType, f16_at};
use super::interleaved_k;
use super::kernel::{Acts, QuantKernel};
use super::portable;

/// Rows per group.
pub(crate) const GROUP_ROWS: usize = 16;

/// Where the parts of a group block lie, in bytes from its start.
#[derive(Clone, Copy)]
pub(crate) struct Parts {
    /// Minimums (Q4_1, Q5_1).
    pub(crate) m: Option<usize>,
    /// Fifth bits (Q5_0, Q5_1).
    pub(crate) qh: Option<usize>,
    /// The values' chunks.
    pub(crate) qs: usize,
    /// The whole group block: 16 of the type's blocks.
    pub(crate) bytes: usize,
}

/// The parts of a 32-value type's group block.
pub(crate) const fn parts(ty: QuantType) -> Parts {
    let has_min = matches!(ty, QuantType::Q4_1 | QuantType::Q5_1);
    let has_high = matches!(ty, QuantType::Q5_0 | QuantType::Q5_1);
    let m = if has_min { Some(32) } else { None };
    let after_m = if has_min { 64 } else { 32 };
    let qh = if has_high { Some(after_m) } else { None };
    let qs = if has_high { after_m + 64 } else { after_m };
    let chunks = if matches!(ty, QuantType::Q8_0) { 8 } else { 4 };
    Parts { m, qh, qs, bytes: qs + 64 * chunks }
}

/// Bytes of one group block: sixteen of the type's blocks.
pub(crate) fn group_block_bytes(ty: QuantType) -> usize {
    GROUP_ROWS * ty.block_bytes()
}

/// Groups repacked between two calls of `interleave`'s `done`: a few MiB of the source, so a
/// caller that releases what was read holds little of both copies at once.
const GROUPS_PER_STEP: usize = 64;

/// Bytes of the interleaved form of an `[n_out, k]` matrix of `ty`.
pub(crate) fn interleaved_len(ty: QuantType, n_out: usize, k: usize) -> usize {
    n_out.div_ceil(GROUP_ROWS) * (k / ty.block_values()) * group_block_bytes(ty)
}

/// Writes `bytes` (an `[n_out, k]` matrix of `ty` in the file's layout) interleaved into `out`
/// (zeroed, [`interleaved_len`] bytes), calling `done(n)` whenever the first `n` bytes of
/// `bytes` will not be read again.
pub(crate) fn interleave(ty: QuantType, n_out: usize, k: usize, bytes: &[u8], out: &mut [u8], done: &dyn Fn(usize)) {
    let nb = k / ty.block_values();
    let row_bytes = ty.row_bytes(k);
    debug_assert_eq!(bytes.len(), n_out * row_bytes);
    assert_eq!(out.len(), interleaved_len(ty, n_out, k), "room for the interleaved matrix");
    debug_assert!(out.iter().all(|&b| b == 0), "a zeroed output");
    let gbb = group_block_bytes(ty);
    for (step, groups) in out.chunks_mut(GROUPS_PER_STEP * nb * gbb).enumerate() {
        groups.par_chunks_mut(nb * gbb).enumerate().for_each(|(g, group)| {
            put_group(ty, n_out, k, bytes, (step * GROUPS_PER_STEP + g) * GROUP_ROWS, group);
        });
        done((((step + 1) * GROUPS_PER_STEP * GROUP_ROWS).min(n_out)) * row_bytes);
    }
}

/// Writes rows `first..first + 16` of `bytes` (the last row repeated past `n_out`) as the
/// group `group`.
fn put_group(ty: QuantType, n_out: usize, k: usize, bytes: &[u8], first: usize, group: &mut [u8]) {
    let (bb, row_bytes) = (ty.block_bytes(), ty.row_bytes(k));
    let gbb = group_block_bytes(ty);
    let src = |r: usize, b: usize| &bytes[(first + r).min(n_out - 1) * row_bytes + b * bb..][..bb];
    for (b, gb) in group.chunks_exact_mut(gbb).enumerate() {
        for r in 0..GROUP_ROWS {
            match ty.act_format() {
                ActFormat::Q8K => interleaved_k::put(ty, src(r, b), gb, r),
                ActFormat::Q8_0 => put(ty, src(r, b), gb, r),
            }
        }
    }
}

/// Writes `src` (one of the file's blocks of a 32-value `ty`) as row `r` of group block `gb`
/// (zeroed before its first row).
fn put(ty: QuantType, src: &[u8], gb: &mut [u8], r: usize) {
    let p = parts(ty);
    // Where a type's fields lie in the file's block: (minimum, fifth bits, values).
    let (m_at, qh_at, qs_at) = match ty {
        QuantType::Q4_0 => (None, None, 2),
        QuantType::Q4_1 => (Some(2), None, 4),
        QuantType::Q5_0 => (None, Some(2), 6),
        QuantType::Q5_1 => (Some(2), Some(4), 8),
        _ => (None, None, 2),
    };
    gb[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
    if let (Some(at), Some(to)) = (m_at, p.m) {
        gb[to + 2 * r..to + 2 * r + 2].copy_from_slice(&src[at..at + 2]);
    }
    if let (Some(at), Some(to)) = (qh_at, p.qh) {
        let qh = u32::from_le_bytes(src[at..at + 4].try_into().expect("four bytes"));
        for j in 0..QK8_0 {
            let bit = 4 * r + j % 4;
            gb[to + 8 * (j / 4) + bit / 8] |= (((qh >> j) & 1) as u8) << (bit % 8);
        }
    }
    for c in 0..(p.bytes - p.qs) / 64 {
        let at = p.qs + 64 * c + 4 * r;
        gb[at..at + 4].copy_from_slice(&src[qs_at + 4 * c..qs_at + 4 * c + 4]);
    }
}

/// Block `b`'s row `r` (of the group whose bytes are `group`), decoded.
pub(crate) fn block(ty: QuantType, group: &[u8], b: usize, r: usize) -> Block32 {
    let p = parts(ty);
    let gb = &group[b * p.bytes..(b + 1) * p.bytes];
    let mut q = [0i8; QK8_0];
    for (j, q) in q.iter_mut().enumerate() {
        *q = if ty == QuantType::Q8_0 {
            gb[p.qs + 64 * (j / 4) + 4 * r + j % 4] as i8
        } else {
            let byte = gb[p.qs + 64 * (j % 16 / 4) + 4 * r + j % 4];
            let nibble = if j < 16 { byte & 0xF } else { byte >> 4 };
            let fifth = p.qh.map_or(0, |at| {
                let bit = 4 * r + j % 4;
                (gb[at + 8 * (j / 4) + bit / 8] >> (bit % 8)) & 1
            });
            (nibble | fifth << 4) as i8
        };
    }
    let offset = match ty {
        QuantType::Q4_0 => 8,
        QuantType::Q5_0 => 16,
        _ => 0,
    };
    Block32 { q, d: f16_at(gb, 2 * r), m: p.m.map_or(0.0, |at| f16_at(gb, at + 2 * r)), offset }
}

/// Row `r` of a group (`nb` blocks) times `x`, in portable code.
pub(crate) fn dot(ty: QuantType, group: &[u8], nb: usize, r: usize, x: Q8Row) -> f32 {
    portable::dot_blocks(ty, (0..nb).map(|b| block(ty, group, b, r)), x)
}

/// Sixteen rows of a group times each of `acts`, in portable code: `out[n * 16 + r]`.
pub(crate) fn portable_tile(ty: QuantType, group: &[u8], nb: usize, acts: Acts, out: &mut [f32]) {
    for r in 0..GROUP_ROWS {
        match acts {
            Acts::Q8(x) => {
                for (n, &x) in x.iter().enumerate() {
                    out[n * GROUP_ROWS + r] = dot(ty, group, nb, r, x);
                }
            }
            Acts::Q8K(x) => {
                for (n, &x) in x.iter().enumerate() {
                    let blocks = (0..nb).map(|b| interleaved_k::block(ty, group, b, r));
                    out[n * GROUP_ROWS + r] = portable::dot_k_blocks(ty, blocks, x);
                }
            }
        }
    }
}

/// Row `r` of a group (`nb` blocks) in f32, as the file's blocks dequantize.
pub(crate) fn dequantize_row(ty: QuantType, group: &[u8], nb: usize, r: usize, out: &mut [f32]) {
    for (b, out) in out.chunks_exact_mut(ty.block_values()).enumerate().take(nb) {
        match ty.act_format() {
            ActFormat::Q8_0 => block(ty, group, b, r).dequantize_into(out),
            ActFormat::Q8K => interleaved_k::block(ty, group, b, r).dequantize_into(ty, out),
        }
    }
}

/// The most activation rows one group call takes: a K-quant kernel decodes a block's scales
/// once for all of them (the kernels take them four at a time).
pub(crate) const MAX_ACTS: usize = 16;

/// Sixteen rows of a group (`nb` group blocks of `ty`) times `acts`: `out[n * 16 + r]`, on a
/// resolved, available `kernel`. `stream`: the group is read from memory, not from a cache an
/// earlier tile of the same weights filled, so the x86 kernels ask for its bytes ahead (a hint
/// only: the results are the same either way). The lengths are checked in every build: the x86
/// kernels read through raw pointers.
pub(crate) fn tile(
    kernel: QuantKernel,
    ty: QuantType,
    group: &[u8],
    nb: usize,
    acts: Acts,
    out: &mut [f32],
    stream: bool,
) {
    assert_eq!(group.len(), nb * group_block_bytes(ty), "a group of {nb} blocks");
    assert!((1..=MAX_ACTS).contains(&acts.len()), "1 to {MAX_ACTS} activation rows");
    assert_eq!(out.len(), acts.len() * GROUP_ROWS, "sixteen outputs per activation row");
    match acts {
        Acts::Q8(x) => {
            assert_eq!(ty.act_format(), ActFormat::Q8_0);
            assert!(x.iter().all(|x| x.qs.len() == nb * QK8_0 && x.d.len() == nb && x.sums.len() == nb));
        }
        Acts::Q8K(x) => {
            assert_eq!(ty.act_format(), ActFormat::Q8K);
            assert!(x.iter().all(|x| x.qs.len() == nb * 256 && x.d.len() == nb && x.bsums.len() == nb * 16));
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        use super::{interleaved_k_x86 as xk, interleaved_x86 as x86};
        let g = group.as_ptr();
        let vnni_encoding = crate::cpu::has_avxvnni();
        // SAFETY: the lengths were checked above; each kernel runs only where `is_available`
        // (its caller's check) or the encoding's own detection says the CPU has it.
        unsafe {
            match (kernel, acts) {
                (QuantKernel::Avx2, Acts::Q8(x)) => return x86::group_avx2(ty, g, nb, x, out, stream),
                (QuantKernel::AvxVnni, Acts::Q8(x)) if vnni_encoding => {
                    return x86::group_avxvnni(ty, g, nb, x, out, stream);
                }
                (QuantKernel::AvxVnni, Acts::Q8(x)) => return x86::group_avx512vnni_256(ty, g, nb, x, out, stream),
                (QuantKernel::Avx512, Acts::Q8(x)) => return x86::group_avx512(ty, g, nb, x, out, stream),
                (QuantKernel::Avx2, Acts::Q8K(x)) => return xk::group_avx2(ty, g, nb, x, out, stream),
                (QuantKernel::AvxVnni, Acts::Q8K(x)) if vnni_encoding => {
                    return xk::group_avxvnni(ty, g, nb, x, out, stream);
                }
                (QuantKernel::AvxVnni, Acts::Q8K(x)) => return xk::group_avx512vnni_256(ty, g, nb, x, out, stream),
                (QuantKernel::Avx512, Acts::Q8K(x)) => return xk::group_avx512(ty, g, nb, x, out, stream),
                _ => {}
            }
        }
    }
    let _ = (kernel, stream);
    portable_tile(ty, group, nb, acts, out);
}
