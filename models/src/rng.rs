//! The one seeded random generator of the workspace: SplitMix64, small, fast and the same on
//! every platform and version, which is all its users need (a request's `seed`, random weights
//! of a shape, the benchmarks' generated workloads). Owning the algorithm keeps a seed's draws
//! stable across dependency upgrades; it is not for anything that must be unpredictable.

/// SplitMix64 (Steele, Lea and Flood): a 64-bit counter through a mixing function.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The state, e.g. to derive another generator from it.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn matches_the_reference_sequence() {
        // The first outputs for seed 0 of the reference implementation (Vigna's splitmix64.c).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn uniform_draws_stay_in_the_unit_interval() {
        let mut rng = SplitMix64::new(7);
        assert!((0..10_000).map(|_| rng.next_f64()).all(|u| (0.0..1.0).contains(&u)));
    }
}
