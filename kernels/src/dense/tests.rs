//! The dense matmul: bitwise the same row whatever the batch around it, the thread count and
//! the kernel; close to an f64 reference.

use proptest::prelude::*;

use super::*;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

fn matrix(n_out: usize, k: usize, dtype: u8, seed: u64) -> DenseMatrix {
    let w = values(n_out * k, seed);
    let weights = match dtype {
        0 => DenseWeights::F32(w),
        1 => DenseWeights::F16(w.iter().map(|&v| f16::from_f32(v)).collect()),
        _ => DenseWeights::BF16(w.iter().map(|&v| bf16::from_f32(v)).collect()),
    };
    DenseMatrix::new(n_out, k, weights).unwrap()
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
}

fn product(m: &DenseMatrix, x: &[f32], kernel: DenseKernel, threads: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len() / m.k() * m.n_out()];
    pool(threads).install(|| m.matmul_with(x, &mut out, kernel)).unwrap();
    out
}

fn kernels() -> Vec<DenseKernel> {
    let mut all = vec![DenseKernel::Portable];
    if DenseKernel::Avx2.is_available() {
        all.push(DenseKernel::Avx2);
    } else {
        eprintln!("dense: the AVX2 kernel is not tested: this CPU lacks AVX2, FMA or F16C");
    }
    all
}

#[test]
fn products_are_close_to_an_f64_reference() {
    for dtype in 0..3 {
        let (n_out, k, m) = (37, 203, 5);
        let w = matrix(n_out, k, dtype, 3);
        let x = values(m * k, 4);
        let mut dense = vec![0.0f32; k];
        for kernel in kernels() {
            let got = product(&w, &x, kernel, 2);
            for r in 0..m {
                for j in 0..n_out {
                    w.row_f32(j, &mut dense).unwrap();
                    let want: f64 = (0..k).map(|i| x[r * k + i] as f64 * dense[i] as f64).sum();
                    let err = (got[r * n_out + j] as f64 - want).abs();
                    assert!(
                        err < 1e-4 * (1.0 + want.abs()),
                        "{kernel:?} dtype {dtype}: {} vs {want}",
                        got[r * n_out + j]
                    );
                }
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    let w = matrix(4, 8, 0, 1);
    let mut out = vec![0.0; 4];
    assert!(matches!(w.matmul(&[0.0; 7], &mut out), Err(KernelError::RaggedRows { .. })));
    assert!(matches!(w.matmul(&[0.0; 16], &mut out), Err(KernelError::LengthMismatch { .. })));
    assert!(DenseMatrix::new(2, 3, DenseWeights::F32(vec![0.0; 5])).is_err());
    assert!(DenseMatrix::new(0, 3, DenseWeights::F32(Vec::new())).is_err());
    assert!(w.row_f32(4, &mut [0.0; 8]).is_err());
    assert!(w.matmul(&[], &mut []).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Each row of a batch equals that row alone (a decode step), bitwise, for any batch size,
    /// thread count and kernel, and the kernels agree with each other bitwise.
    #[test]
    fn a_row_never_depends_on_the_batch_the_threads_or_the_kernel(
        n_out in 1usize..70, k in 1usize..90, m in 1usize..40, dtype in 0u8..3, threads in 1usize..4, seed: u64,
    ) {
        let w = matrix(n_out, k, dtype, seed);
        let x = values(m * k, seed ^ 7);
        let reference = product(&w, &x, DenseKernel::Portable, 1);
        for kernel in kernels() {
            let batch = product(&w, &x, kernel, threads);
            prop_assert_eq!(batch.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                reference.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{:?} against the portable kernel", kernel);
            let r = (seed as usize) % m;
            let alone = product(&w, &x[r * k..(r + 1) * k], kernel, threads);
            prop_assert_eq!(&alone[..], &batch[r * n_out..(r + 1) * n_out], "row {} alone, {:?}", r, kernel);
        }
    }
}

/// The values' little-endian bytes, at offset `skew` of a buffer aligned to 8 (as a
/// memory-mapped file holds them).
fn mapped(w: &DenseMatrix, skew: usize) -> DenseWeights {
    let (ty, bytes): (FloatType, Vec<u8>) = match w.weights().view() {
        View::F32(v) => (FloatType::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        View::F16(v) => (FloatType::F16, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        View::BF16(v) => (FloatType::BF16, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    // u64 words keep the buffer 8-aligned; `skew` then moves the values off it.
    let mut words = vec![0u64; (bytes.len() + skew).div_ceil(8)];
    let buffer: &mut [u8] =
        // SAFETY: a u64 buffer viewed as its bytes.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) };
    buffer[skew..skew + bytes.len()].copy_from_slice(&bytes);
    let owner = WeightBytes::new(std::sync::Arc::new(AlignedBytes(words)));
    DenseWeights::Mapped(ty, owner.slice(skew..skew + bytes.len()).unwrap())
}

/// u64 words read as their bytes: an owner whose bytes are 8-aligned.
struct AlignedBytes(Vec<u64>);

impl AsRef<[u8]> for AlignedBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the words' memory viewed as bytes, for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * 8) }
    }
}

#[test]
fn values_read_in_place_give_the_same_products_and_misaligned_ones_are_refused() {
    for dtype in 0..3 {
        let (n_out, k) = (19, 77);
        let owned = matrix(n_out, k, dtype, 8);
        let in_place = DenseMatrix::new(n_out, k, mapped(&owned, 0)).unwrap();
        let x = values(3 * k, 9);
        for kernel in kernels() {
            assert_eq!(product(&in_place, &x, kernel, 2), product(&owned, &x, kernel, 2), "dtype {dtype}");
        }
        let (mut a, mut b) = (vec![0.0; k], vec![0.0; k]);
        in_place.row_f32(5, &mut a).unwrap();
        owned.row_f32(5, &mut b).unwrap();
        assert_eq!(a, b);
        assert!(DenseMatrix::new(n_out, k, mapped(&owned, 1)).is_err(), "dtype {dtype}: odd address");
    }
}
