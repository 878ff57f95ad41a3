//! The AVX-512 VNNI bodies of the K-quant kernels ([`super`]): one 512-bit lane per output
//! row, `vpdpbusd` multiplying four unsigned weight values by four broadcast activation bytes.
//! Every function needs AVX-512 F and BW, the dot products VNNI too (callers check).

use std::arch::x86_64::*;

use super::{ActBlock, MAX_ACT_ROWS, Q4KTile, Q6KTile, QK_K, TILE_ROWS};

/// Four activation bytes at `off`, broadcast to every lane.
#[inline(always)]
unsafe fn bcast4(qs: &[i8; QK_K], off: usize) -> __m512i {
    // SAFETY: callers keep `off + 4 <= 256`.
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(qs.as_ptr().add(off) as *const i32)) }
}

/// See [`super::quantize_block`]: the same values, 16 at a time.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize_block(x: &[f32; QK_K], out: &mut ActBlock) {
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    let abs = |v: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs_mask));
    let mut m = _mm512_setzero_ps();
    for i in 0..QK_K / 16 {
        // SAFETY: 16 values from 16i, inside the 256.
        let v = unsafe { _mm512_loadu_ps(x.as_ptr().add(16 * i)) };
        // `max` returns its second operand when one is NaN: NaNs are skipped.
        m = _mm512_max_ps(abs(v), m);
    }
    let amax = _mm512_reduce_max_ps(m);
    if amax == 0.0 {
        *out = ActBlock::ZERO;
        return;
    }
    let iscale = 127.0 / amax;
    let scale = _mm512_set1_ps(iscale);
    let half = _mm512_set1_ps(0.5);
    let one = _mm512_castps_si512(_mm512_set1_ps(1.0));
    let sign_mask = _mm512_set1_epi32(i32::MIN);
    let mut sums16 = [0i32; 16];
    for (i, sum) in sums16.iter_mut().enumerate() {
        // SAFETY: as above.
        let v = _mm512_mul_ps(unsafe { _mm512_loadu_ps(x.as_ptr().add(16 * i)) }, scale);
        // Round half away from zero (`f32::round`): truncate, then step away from zero where
        // the dropped fraction (exact) is at least one half.
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
        let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(abs(_mm512_sub_ps(v, t)), half);
        let step = _mm512_castsi512_ps(_mm512_or_si512(one, _mm512_and_si512(_mm512_castps_si512(v), sign_mask)));
        let r = _mm512_mask_add_ps(t, away, t, step);
        // NaN lanes become 0 (the conversion would give i32::MIN).
        let q = _mm512_maskz_cvttps_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v), r);
        // SAFETY: 16 bytes at 16i, inside the 256.
        unsafe { _mm_storeu_si128(out.qs.as_mut_ptr().add(16 * i) as *mut __m128i, _mm512_cvtepi32_epi8(q)) };
        *sum = _mm512_reduce_add_epi32(q);
    }
    out.d = 1.0 / iscale;
    for (o, s) in out.neg32_sums16.iter_mut().zip(&sums16) {
        *o = -32 * s;
    }
    for (t, o) in out.sums32.iter_mut().enumerate() {
        *o = (sums16[2 * t] + sums16[2 * t + 1]) as i16;
    }
}

/// [`super::q4k_dot`] for `M` activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q4k_rows<const M: usize>(
    tiles: &[Q4KTile],
    acts: &[&[ActBlock]],
    out: &mut [[f32; TILE_ROWS]; MAX_ACT_ROWS],
) {
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); M];
    for (b, tile) in tiles.iter().enumerate() {
        let a: [&ActBlock; M] = std::array::from_fn(|m| &acts[m][b]);
        let mut part = [_mm512_setzero_ps(); M];
        for s in 0..8 {
            // Two chains (low and high nibbles) so that few rows do not wait on one latency.
            let mut lo_sum = [_mm512_setzero_si512(); M];
            let mut hi_sum = [_mm512_setzero_si512(); M];
            for g in 0..4 {
                // SAFETY: 64 bytes at (4s + g) * 64, inside the 2048.
                let w = unsafe { _mm512_loadu_si512(tile.qs.as_ptr().add((4 * s + g) * 64) as *const _) };
                let lo = _mm512_and_si512(w, low);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), low);
                for m in 0..M {
                    // SAFETY: offsets below 256 - 4.
                    unsafe {
                        lo_sum[m] = _mm512_dpbusd_epi32(lo_sum[m], lo, bcast4(&a[m].qs, 32 * s + 4 * g));
                        hi_sum[m] = _mm512_dpbusd_epi32(hi_sum[m], hi, bcast4(&a[m].qs, 32 * s + 16 + 4 * g));
                    }
                }
            }
            // SAFETY: 16 floats.
            let scale = unsafe { _mm512_loadu_ps(tile.scales[s].as_ptr()) };
            for m in 0..M {
                let isum = _mm512_add_epi32(lo_sum[m], hi_sum[m]);
                part[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, part[m]);
            }
        }
        let mut msum = [_mm512_setzero_si512(); M];
        for t in 0..4 {
            // SAFETY: 32 i16 values.
            let mins = unsafe { _mm512_loadu_si512(tile.mins[t].as_ptr() as *const _) };
            for m in 0..M {
                // Sums 2t (low half) and 2t + 1 (high half), one i32 lane's pair of i16.
                let pair = (a[m].sums32[2 * t] as u16 as u32 | (a[m].sums32[2 * t + 1] as u16 as u32) << 16) as i32;
                msum[m] = _mm512_dpwssd_epi32(msum[m], mins, _mm512_set1_epi32(pair));
            }
        }
        // SAFETY: 16 floats.
        let dmin = unsafe { _mm512_loadu_ps(tile.dmin.as_ptr()) };
        for m in 0..M {
            part[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[m]), dmin, part[m]);
            acc[m] = _mm512_fmadd_ps(part[m], _mm512_set1_ps(a[m].d), acc[m]);
        }
    }
    for m in 0..M {
        // SAFETY: 16 floats.
        unsafe { _mm512_storeu_ps(out[m].as_mut_ptr(), acc[m]) };
    }
}

/// [`super::q6k_dot`] for `M` activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q6k_rows<const M: usize>(
    tiles: &[Q6KTile],
    acts: &[&[ActBlock]],
    out: &mut [[f32; TILE_ROWS]; MAX_ACT_ROWS],
) {
    let mut acc = [_mm512_setzero_ps(); M];
    for (b, tile) in tiles.iter().enumerate() {
        let a: [&ActBlock; M] = std::array::from_fn(|m| &acts[m][b]);
        let mut part = [_mm512_setzero_ps(); M];
        for s in 0..16 {
            // The sums start at the offset's -32 * Σ x.
            let mut isum: [__m512i; M] = std::array::from_fn(|m| _mm512_set1_epi32(a[m].neg32_sums16[s]));
            for g in 0..4 {
                // SAFETY: 64 bytes at (4s + g) * 64, inside the 4096.
                let w = unsafe { _mm512_loadu_si512(tile.qs.as_ptr().add((4 * s + g) * 64) as *const _) };
                for m in 0..M {
                    // SAFETY: offsets below 256 - 4.
                    isum[m] = _mm512_dpbusd_epi32(isum[m], w, unsafe { bcast4(&a[m].qs, 16 * s + 4 * g) });
                }
            }
            // SAFETY: 16 floats.
            let scale = unsafe { _mm512_loadu_ps(tile.scales[s].as_ptr()) };
            for m in 0..M {
                part[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), scale, part[m]);
            }
        }
        for m in 0..M {
            acc[m] = _mm512_fmadd_ps(part[m], _mm512_set1_ps(a[m].d), acc[m]);
        }
    }
    for m in 0..M {
        // SAFETY: 16 floats.
        unsafe { _mm512_storeu_ps(out[m].as_mut_ptr(), acc[m]) };
    }
}

/// Dispatches `$f::<M>` for `M = acts.len()` in `1..=8`.
macro_rules! by_rows {
    ($f:ident, $tiles:expr, $acts:expr, $out:expr) => {
        // SAFETY (for the callers): the features are the callers' own.
        unsafe {
            match $acts.len() {
                1 => $f::<1>($tiles, $acts, $out),
                2 => $f::<2>($tiles, $acts, $out),
                3 => $f::<3>($tiles, $acts, $out),
                4 => $f::<4>($tiles, $acts, $out),
                5 => $f::<5>($tiles, $acts, $out),
                6 => $f::<6>($tiles, $acts, $out),
                7 => $f::<7>($tiles, $acts, $out),
                8 => $f::<8>($tiles, $acts, $out),
                n => unreachable!("{n} activation rows for one tile pass"),
            }
        }
    };
}

/// See [`super::q4k_dot`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn q4k_dot(tiles: &[Q4KTile], acts: &[&[ActBlock]], out: &mut [[f32; TILE_ROWS]; MAX_ACT_ROWS]) {
    by_rows!(q4k_rows, tiles, acts, out)
}

/// See [`super::q6k_dot`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn q6k_dot(tiles: &[Q6KTile], acts: &[&[ActBlock]], out: &mut [[f32; TILE_ROWS]; MAX_ACT_ROWS]) {
    by_rows!(q6k_rows, tiles, acts, out)
}

/// [`super::swiglu`], compiled for AVX-512 so that the portable body vectorizes 16 wide.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
    super::swiglu_portable(gate, up)
}
