//! What the quantized-matmul tests share: a small deterministic generator (xorshift64*), so
//! failures reproduce.

/// xorshift64* over a non-zero seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Roughly Gaussian (sum of uniforms), with an occasional outlier as real activations have.
    pub fn activation(&mut self) -> f32 {
        let g = (0..4).map(|_| self.unit()).sum::<f32>();
        if self.next().is_multiple_of(97) { g * 20.0 } else { g }
    }
}
