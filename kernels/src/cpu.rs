//! What this CPU can run: the one place the kernels ask (attention picks its tile kernels here,
//! the quantized matmuls their dot products), so every family agrees on what a CPU supports.
//! `std` caches the CPUID reads, so asking per call is cheap. Off x86_64 every answer is false
//! and the portable code runs.
//!
//! `RADIX_CPU_ISA` lowers what the kernels use (never raises it past what the CPU has), so that
//! each path runs and is measured on the machine at hand: `portable`, `avx2` (AVX2 + FMA +
//! F16C), `avxvnni` (AVX2 with 256-bit VNNI) or `avx512`. It is read once per process.

use std::sync::OnceLock;

/// An instruction-set level the CPU kernels use, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuIsa {
    /// Portable Rust only (what aarch64 and old x86_64 run).
    Portable,
    /// AVX2, FMA and F16C.
    Avx2,
    /// AVX2 with 8-bit dot products on 256-bit vectors (AVX-VNNI, or AVX-512 VNNI with VL).
    AvxVnni,
    /// AVX-512 F, BW, VL and VNNI where present.
    Avx512,
}

/// The environment variable that lowers the level the kernels use.
pub const CPU_ISA_ENV: &str = "RADIX_CPU_ISA";

impl CpuIsa {
    /// The level's name as `RADIX_CPU_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            CpuIsa::Portable => "portable",
            CpuIsa::Avx2 => "avx2",
            CpuIsa::AvxVnni => "avxvnni",
            CpuIsa::Avx512 => "avx512",
        }
    }

    /// Parses a level's name (as [`name`](Self::name) gives it).
    pub fn parse(s: &str) -> Result<CpuIsa, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" | "generic" => Ok(CpuIsa::Portable),
            "avx2" => Ok(CpuIsa::Avx2),
            "avxvnni" | "avx-vnni" | "vnni" => Ok(CpuIsa::AvxVnni),
            "avx512" | "avx-512" => Ok(CpuIsa::Avx512),
            other => Err(format!("{CPU_ISA_ENV}={other:?} is not one of portable, avx2, avxvnni, avx512")),
        }
    }

    /// The level `RADIX_CPU_ISA` asks for: `Ok(None)` when unset, an error naming the accepted
    /// values when it holds something else (the kernels then ignore it; a binary should refuse
    /// to start).
    pub fn from_env() -> Result<Option<CpuIsa>, String> {
        match std::env::var(CPU_ISA_ENV) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => CpuIsa::parse(&v).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(format!("{CPU_ISA_ENV}: {e}")),
        }
    }

    /// The highest level this CPU supports.
    pub fn detected() -> CpuIsa {
        if detect::avx512() {
            CpuIsa::Avx512
        } else if detect::vnni_256() {
            CpuIsa::AvxVnni
        } else if detect::avx2_fma_f16c() {
            CpuIsa::Avx2
        } else {
            CpuIsa::Portable
        }
    }

    /// The level the kernels use: the detected one, lowered by `RADIX_CPU_ISA`.
    pub fn active() -> CpuIsa {
        *cap()
    }
}

/// The cap `RADIX_CPU_ISA` puts on every answer below, read once.
fn cap() -> &'static CpuIsa {
    static CAP: OnceLock<CpuIsa> = OnceLock::new();
    CAP.get_or_init(|| match CpuIsa::from_env() {
        Ok(Some(forced)) => forced.min(CpuIsa::detected()),
        _ => CpuIsa::detected(),
    })
}

/// Whether the active level is at least `level`.
fn allowed(level: CpuIsa) -> bool {
    *cap() >= level
}

/// The CPU's own answers, before the cap.
mod detect {
    /// AVX2, FMA and F16C.
    pub(super) fn avx2_fma_f16c() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            has!("avx2") && has!("fma") && has!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// AVX2 and a 256-bit `vpdpbusd`.
    pub(super) fn vnni_256() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            avx2_fma_f16c() && (has!("avxvnni") || (has!("avx512vnni") && has!("avx512vl")))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// AVX-512 F, BW and VL (the attention tiles need F only; the matmuls all three).
    pub(super) fn avx512() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            avx2_fma_f16c() && has!("avx512f") && has!("avx512bw") && has!("avx512vl")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

/// AVX2 and FMA: the 8-lane float and integer kernels.
pub(crate) fn has_avx2_fma() -> bool {
    allowed(CpuIsa::Avx2) && detect::avx2_fma_f16c()
}

/// AVX2, FMA and F16C: what the attention kernels need to read f16 K/V in registers.
pub(crate) fn has_avx2_fma_f16c() -> bool {
    has_avx2_fma()
}

/// AVX-512F: the 16-lane attention score and weighted-sum kernels.
pub(crate) fn has_avx512f() -> bool {
    allowed(CpuIsa::Avx512) && detect::avx512()
}

/// AVX-VNNI: the VEX encoding of the 256-bit `vpdpbusd`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avxvnni() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni")
}

/// AVX2, FMA and a 256-bit `vpdpbusd` (AVX-VNNI, or AVX-512 VNNI with AVX512VL): the 8-bit
/// dot products of the quantized matmuls.
pub(crate) fn has_vnni_256() -> bool {
    allowed(CpuIsa::AvxVnni) && detect::vnni_256()
}

/// AVX-512 F, BW, VL and VNNI: the 512-bit 8-bit dot-product kernels.
pub(crate) fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx512f() && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level parses from its own name, and nothing else parses.
    #[test]
    fn levels_parse_from_their_names() {
        for level in [CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::AvxVnni, CpuIsa::Avx512] {
            assert_eq!(CpuIsa::parse(level.name()), Ok(level));
        }
        let err = CpuIsa::parse("sse9").unwrap_err();
        assert!(err.contains("RADIX_CPU_ISA") && err.contains("avx2"), "{err}");
    }

    /// The active level never exceeds the detected one, and the answers follow it.
    #[test]
    fn the_cap_never_raises_past_the_cpu() {
        assert!(CpuIsa::active() <= CpuIsa::detected());
        assert!(!has_avx2_fma() || CpuIsa::active() >= CpuIsa::Avx2);
        assert!(!has_avx512f() || CpuIsa::active() == CpuIsa::Avx512);
        assert!(!has_vnni_256() || CpuIsa::active() >= CpuIsa::AvxVnni);
    }
}
