//! Small f32 vector primitives written so that the compiler vectorizes them.

/// Lanes of the independent accumulators in [`dot_with`].
const LANES: usize = 8;

/// Dot product of `a` with the values `b(0..a.len())` (a K row's elements converted to f32
/// as they are read), with [`LANES`] separate accumulators so the loop vectorizes without
/// reassociation: the same values always give the same bits.
#[inline(always)]
pub(crate) fn dot_with(a: &[f32], b: impl Fn(usize) -> f32) -> f32 {
    let ac = a.chunks_exact(LANES);
    let ar = ac.remainder();
    let mut acc = [0.0f32; LANES];
    for (i, x) in ac.enumerate() {
        for j in 0..LANES {
            acc[j] += x[j] * b(i * LANES + j);
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    let tail = a.len() - ar.len();
    for (i, x) in ar.iter().enumerate() {
        sum += x * b(tail + i);
    }
    sum
}

/// `y += a * x` for the values `x(0..y.len())`.
#[inline(always)]
pub(crate) fn axpy_with(y: &mut [f32], a: f32, x: impl Fn(usize) -> f32) {
    for (i, y) in y.iter_mut().enumerate() {
        *y += a * x(i);
    }
}

/// `y *= a`.
#[inline(always)]
pub(crate) fn scale(y: &mut [f32], a: f32) {
    for y in y.iter_mut() {
        *y *= a;
    }
}

/// `x -> exp(x)` over a slice, with a polynomial that vectorizes (Cephes
/// `expf`: range reduction by `ln 2` and a degree-6 polynomial), relative
/// error within a few ulp. Inputs below -87 (including `-inf`) give exactly 0;
/// NaN stays NaN. Uses only IEEE `+ - *` and bit operations, so every
/// instruction set gives bitwise equal results.
#[inline(always)]
pub(crate) fn exp_in_place(xs: &mut [f32]) {
    for x in xs.iter_mut() {
        *x = exp_approx(*x);
    }
}

/// One element of [`exp_in_place`].
#[inline(always)]
pub(crate) fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Rounds to the nearest integer for |t| < 2^22 (1.5 * 2^23).
    const ROUND: f32 = 12_582_912.0;
    const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];
    // Clamp so that 2^n stays a normal float; NaN passes through.
    let xc = x.clamp(-87.0, 88.0);
    // `t` is `ROUND + n` exactly, so its low mantissa bits hold n: reading
    // them back (below) vectorizes, where a float-to-int cast does not.
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = P[0];
    for c in &P[1..] {
        p = p * r + c;
    }
    let y = p * (r * r) + r + 1.0;
    // n is an integer in -126..=127 here, so n + 127 is a normal exponent
    // (NaN gives some pow2, and y is NaN anyway).
    let pow2 = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    if x < -87.0 { 0.0 } else { y * pow2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0.0f64;
        for i in 0..=2_000_000u32 {
            // -87 ..= 1
            let x = (-87.0 + 88.0 * i as f64 / 2_000_000.0) as f32;
            let mut v = [x];
            exp_in_place(&mut v);
            let want = (x as f64).exp();
            worst = worst.max((v[0] as f64 - want).abs() / want);
        }
        // A few ulp (f32 ulp is 1.2e-7 relative).
        assert!(worst <= 4e-7, "worst relative error {worst:e}");
        let mut v = [0.0, f32::NEG_INFINITY, -87.5, -1e30, f32::NAN, 88.0];
        exp_in_place(&mut v);
        assert_eq!(v[0], 1.0);
        assert_eq!(&v[1..4], &[0.0, 0.0, 0.0]);
        assert!(v[4].is_nan());
        assert!(v[5].is_finite() && v[5] > 1e38);
    }

    #[test]
    fn dot_axpy_scale_match_naive() {
        for n in [0usize, 1, 7, 8, 9, 16, 31, 80, 128] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let naive: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot_with(&a, |i| b[i]) as f64 - naive).abs() <= 1e-5, "n={n}");

            let mut y = b.clone();
            axpy_with(&mut y, 0.5, |i| a[i]);
            for i in 0..n {
                assert_eq!(y[i], b[i] + 0.5 * a[i]);
            }
            scale(&mut y, 2.0);
            for i in 0..n {
                assert_eq!(y[i], 2.0 * (b[i] + 0.5 * a[i]));
            }
        }
    }
}
