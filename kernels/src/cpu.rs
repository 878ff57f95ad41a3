//! What this CPU can run: the one place the kernels ask (attention picks its tile kernels here,
//! the Q8_0 matmul its inner loop), so both families agree on what a CPU supports. `std` caches
//! the CPUID reads, so asking per call is cheap. Off x86_64 every answer is false and the
//! portable code runs.

/// AVX2 and FMA: the 8-lane float and integer kernels.
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx2") && has!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AVX2, FMA and F16C: what the attention kernels need to read f16 K/V in registers.
pub(crate) fn has_avx2_fma_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AVX-512F: the 16-lane attention score and weighted-sum kernels.
pub(crate) fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AVX-VNNI: the VEX encoding of the 256-bit `vpdpbusd`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avxvnni() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni")
}

/// AVX2, FMA and a 256-bit `vpdpbusd` (AVX-VNNI, or AVX-512 VNNI with AVX512VL): the Q8_0
/// matmul's 8-bit dot-product kernel.
pub(crate) fn has_vnni_256() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has_avx2_fma() && (has_avxvnni() || (has!("avx512vnni") && has!("avx512vl")))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AVX-512 F, BW and VNNI: the 512-bit 8-bit dot-product kernels (the MoE experts' K-quants).
pub(crate) fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f") && has!("avx512bw") && has!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
