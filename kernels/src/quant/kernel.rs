//! Which dot-product kernel runs ([`QuantKernel`]), and the one entry all of them share: a tile
//! of weight rows (one per lane of the kernel's vectors) against a few activation rows.

use super::acts::{Q8KRow, Q8Row};
use super::blocks::{ActFormat, QuantType};
use super::portable;
use crate::cpu;

/// Which implementation of the dot products a matmul uses. Every kernel gives bitwise the
/// same results as [`QuantKernel::Portable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantKernel {
    /// The fastest one this CPU runs (within `RADIX_CPU_ISA`).
    Auto,
    /// Portable Rust, correct everywhere.
    Portable,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 with 256-bit VNNI products (AVX-VNNI, or AVX-512 VNNI with VL).
    AvxVnni,
    /// AVX-512 BW + VNNI: 512-bit K-quant tiles of 16 rows, the 256-bit VNNI kernels for the
    /// 32-value types.
    Avx512,
}

impl QuantKernel {
    /// Every concrete kernel.
    pub const ALL: [QuantKernel; 4] =
        [QuantKernel::Portable, QuantKernel::Avx2, QuantKernel::AvxVnni, QuantKernel::Avx512];

    /// Whether this CPU runs the kernel (within `RADIX_CPU_ISA`).
    pub fn is_available(self) -> bool {
        match self {
            QuantKernel::Auto | QuantKernel::Portable => true,
            QuantKernel::Avx2 => cpu::has_avx2_fma(),
            QuantKernel::AvxVnni => cpu::has_vnni_256(),
            QuantKernel::Avx512 => cpu::has_avx512_vnni(),
        }
    }

    /// `Auto` resolved to a concrete kernel.
    pub fn resolve(self) -> QuantKernel {
        match self {
            QuantKernel::Auto if cpu::has_avx512_vnni() => QuantKernel::Avx512,
            QuantKernel::Auto if cpu::has_vnni_256() => QuantKernel::AvxVnni,
            QuantKernel::Auto if cpu::has_avx2_fma() => QuantKernel::Avx2,
            QuantKernel::Auto => QuantKernel::Portable,
            other => other,
        }
    }

    /// The kernel's name.
    pub fn name(self) -> &'static str {
        match self {
            QuantKernel::Auto => "auto",
            QuantKernel::Portable => "portable",
            QuantKernel::Avx2 => "avx2",
            QuantKernel::AvxVnni => "avxvnni",
            QuantKernel::Avx512 => "avx512",
        }
    }

    /// Weight rows per tile for `ty` (a resolved kernel).
    pub(crate) fn lanes(self, ty: QuantType) -> usize {
        #[cfg(target_arch = "x86_64")]
        if self == QuantKernel::Avx512 && ty.act_format() == ActFormat::Q8K {
            return super::avx512::LANES;
        }
        let _ = ty;
        8
    }

    /// The most activation rows one tile takes for `ty` (a resolved kernel).
    pub(crate) fn max_acts(self, ty: QuantType) -> usize {
        let _ = ty;
        match self {
            #[cfg(target_arch = "x86_64")]
            QuantKernel::Avx512 if ty.act_format() == ActFormat::Q8K => super::avx512::MAX_ACTS,
            #[cfg(target_arch = "x86_64")]
            QuantKernel::Avx2 | QuantKernel::AvxVnni | QuantKernel::Avx512 => super::avx2::max_acts(ty),
            _ => 4,
        }
    }
}

/// A few activation rows in the format a weight type reads.
#[derive(Clone, Copy)]
pub(crate) enum Acts<'a> {
    Q8(&'a [Q8Row<'a>]),
    Q8K(&'a [Q8KRow<'a>]),
}

impl Acts<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Acts::Q8(x) => x.len(),
            Acts::Q8K(x) => x.len(),
        }
    }
}

/// Checks what a tile reads (every row `nb` blocks of `ty`, every activation row as long,
/// `out` one row of results per activation row) and returns `nb`. A failure is a bug of the
/// caller, which validated the matrix and the activations: the kernels read through raw
/// pointers, so this is checked in every build.
pub(crate) fn check_tile(ty: QuantType, rows: &[&[u8]], acts: Acts, out_rows: usize) -> usize {
    let nb = rows[0].len() / ty.block_bytes();
    assert!(rows.iter().all(|r| r.len() == nb * ty.block_bytes()), "ragged weight rows");
    assert_eq!(out_rows, acts.len(), "one output row per activation row");
    match acts {
        Acts::Q8(x) => {
            assert_eq!(ty.act_format(), ActFormat::Q8_0);
            assert!(x.iter().all(|x| x.qs.len() == nb * 32 && x.d.len() == nb && x.sums.len() == nb));
        }
        Acts::Q8K(x) => {
            assert_eq!(ty.act_format(), ActFormat::Q8K);
            assert!(x.iter().all(|x| x.qs.len() == nb * 256 && x.d.len() == nb && x.bsums.len() == nb * 16));
        }
    }
    nb
}

/// One tile: `out[n * lanes + r]` = weight row `rows[r]` times activation row `n`, for a
/// resolved, available `kernel` (`rows.len()` its lanes for `ty`, `acts.len()` at most its
/// `max_acts`).
pub(crate) fn tile(kernel: QuantKernel, ty: QuantType, rows: &[&[u8]], acts: Acts, out: &mut [f32]) {
    let lanes = rows.len();
    debug_assert_eq!(lanes, kernel.lanes(ty));
    debug_assert!(acts.len() <= kernel.max_acts(ty));
    #[cfg(target_arch = "x86_64")]
    {
        use super::{avx2, avx512};
        match kernel {
            QuantKernel::Avx2 => {
                let (rows, out) = eight(rows, out);
                // SAFETY: `Avx2` is only resolved or accepted after `is_available`.
                return unsafe { avx2::tile_avx2(ty, rows, acts, out) };
            }
            QuantKernel::AvxVnni => {
                let (rows, out) = eight(rows, out);
                // SAFETY: as above; each encoding runs only where the CPU has it.
                return unsafe { vnni_256(ty, rows, acts, out) };
            }
            QuantKernel::Avx512 if ty.act_format() == ActFormat::Q8_0 => {
                let (rows, out) = eight(rows, out);
                // SAFETY: as above.
                return unsafe { vnni_256(ty, rows, acts, out) };
            }
            QuantKernel::Avx512 => {
                let rows: &[&[u8]; avx512::LANES] = rows.try_into().expect("sixteen rows");
                // SAFETY: as above.
                return unsafe { avx512::tile(ty, rows, acts, out.as_chunks_mut::<{ avx512::LANES }>().0) };
            }
            _ => {}
        }
    }
    portable_tile(ty, rows, acts, out);
}

/// The rows and outputs of an 8-lane tile.
#[cfg(target_arch = "x86_64")]
fn eight<'a, 'b>(rows: &'a [&'b [u8]], out: &'a mut [f32]) -> (&'a [&'b [u8]; 8], &'a mut [[f32; 8]]) {
    (rows.try_into().expect("eight rows"), out.as_chunks_mut::<8>().0)
}

/// The 256-bit VNNI tile in whichever encoding this CPU has.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and a 256-bit VNNI ([`cpu::has_vnni_256`]).
#[cfg(target_arch = "x86_64")]
unsafe fn vnni_256(ty: QuantType, rows: &[&[u8]; 8], acts: Acts, out: &mut [[f32; 8]]) {
    // SAFETY: the caller's; each encoding runs only where the CPU has it.
    unsafe {
        if cpu::has_avxvnni() {
            super::avx2::tile_avxvnni(ty, rows, acts, out)
        } else {
            super::avx2::tile_avx512vnni(ty, rows, acts, out)
        }
    }
}

/// [`tile`] in portable code: each output by [`portable::dot32`] or [`portable::dot_k`].
fn portable_tile(ty: QuantType, rows: &[&[u8]], acts: Acts, out: &mut [f32]) {
    check_tile(ty, rows, acts, acts.len());
    let lanes = rows.len();
    for (r, row) in rows.iter().enumerate() {
        match acts {
            Acts::Q8(x) => {
                for (n, &x) in x.iter().enumerate() {
                    out[n * lanes + r] = portable::dot32(ty, row, x);
                }
            }
            Acts::Q8K(x) => {
                for (n, &x) in x.iter().enumerate() {
                    out[n * lanes + r] = portable::dot_k(ty, row, x);
                }
            }
        }
    }
}
