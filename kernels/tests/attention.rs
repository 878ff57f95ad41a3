//! Paged attention and write_kv against a naive dense f64 reference.
//!
//! Tolerances (all absolute, on outputs whose magnitude is at most ~1 because
//! V is uniform in [-1, 1)):
//! - f32 storage vs the f64 reference: max |err| <= 1e-5 * max(1, max |ref|).
//! - f16 / bf16 storage vs the f64 reference computed from the *same rounded*
//!   K/V (read back from the cache): max |err| <= 1e-4.
//! - one chunk vs random chunks of the same sequence (decode steps included,
//!   whose long contexts are split across threads): bitwise equal.
//! - different rayon thread counts: bitwise equal.

use half::{bf16, f16};
use proptest::prelude::*;
use radix_kernels::{
    KernelError, KvElement, KvQ4_0, KvQ8_0, PagedLayout, SequenceAttention, hadamard_rotate, k_rotation_block,
    kv_from_f32, kv_to_f32, paged_attention, v_rotation_block, write_kv,
};

/// SplitMix64: small deterministic generator for the fixed random tests.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Uniform in lo..=hi.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    fn shuffle<X>(&mut self, xs: &mut [X]) {
        for i in (1..xs.len()).rev() {
            let j = self.range(0, i);
            xs.swap(i, j);
        }
    }

    fn vec(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * amp).collect()
    }
}

/// One sequence of a test batch, owning its page table.
#[derive(Clone, Debug)]
struct Seq {
    query_start: usize,
    query_len: usize,
    context_len: usize,
    page_table: Vec<u32>,
}

impl Seq {
    fn view(&self) -> SequenceAttention<'_> {
        SequenceAttention {
            query_start: self.query_start,
            query_len: self.query_len,
            context_len: self.context_len,
            page_table: &self.page_table,
        }
    }
}

/// A random batch over a random pool.
struct Case<K, V = K> {
    layout: PagedLayout,
    num_heads: usize,
    scale: f32,
    q: Vec<f32>,
    k: Vec<K>,
    v: Vec<V>,
    seqs: Vec<Seq>,
}

impl<K: KvElement, V: KvElement> Case<K, V> {
    /// `shapes`: (context_len, query_len) per sequence. Page tables take
    /// shuffled page ids (plus spare pages nobody uses), query rows are laid
    /// out in a shuffled sequence order, and every slot of the pool, used or
    /// not, holds random K/V.
    fn random(
        rng: &mut Rng,
        head_dim: usize,
        (num_heads, num_kv_heads): (usize, usize),
        page_size: usize,
        shapes: &[(usize, usize)],
    ) -> Self {
        let needed: usize = shapes.iter().map(|&(c, _)| c.div_ceil(page_size)).sum();
        let num_pages = needed + 3;
        let layout = PagedLayout { num_kv_heads, head_dim, page_size, num_pages };
        let mut pages: Vec<u32> = (0..num_pages as u32).collect();
        rng.shuffle(&mut pages);
        let mut next_page = 0;
        let mut seqs: Vec<Seq> = shapes
            .iter()
            .map(|&(context_len, query_len)| {
                let n = context_len.div_ceil(page_size);
                let page_table = pages[next_page..next_page + n].to_vec();
                next_page += n;
                Seq { query_start: 0, query_len, context_len, page_table }
            })
            .collect();
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        rng.shuffle(&mut order);
        let mut row = 0;
        for &i in &order {
            seqs[i].query_start = row;
            row += seqs[i].query_len;
        }
        let kv: Vec<K> = kv_from_f32(&rng.vec(layout.layer_len(), 1.0));
        let v: Vec<V> = kv_from_f32(&rng.vec(layout.layer_len(), 1.0));
        // Queries of amplitude 3 give peaked as well as flat softmaxes.
        let q = rng.vec(row * num_heads * head_dim, 3.0);
        Case { layout, num_heads, scale: 1.0 / (head_dim as f32).sqrt(), q, k: kv, v, seqs }
    }

    /// The same batch over K/V of other types, left empty for the caller to fill.
    fn with_types<K2, V2>(&self) -> Case<K2, V2> {
        let (layout, num_heads, scale) = (self.layout, self.num_heads, self.scale);
        Case { layout, num_heads, scale, q: self.q.clone(), k: Vec::new(), v: Vec::new(), seqs: self.seqs.clone() }
    }

    fn run(&self) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.q.len()];
        let views: Vec<_> = self.seqs.iter().map(Seq::view).collect();
        paged_attention(&self.layout, self.num_heads, self.scale, &self.q, &self.k, &self.v, &views, &mut out).unwrap();
        out
    }

    /// Dense f64 reference: gathers each context into `[ctx, kv_heads, dim]`
    /// and runs a full softmax per query token and head.
    fn reference(&self) -> Vec<f64> {
        let l = self.layout;
        let (d, kvh, h) = (l.head_dim, l.num_kv_heads, self.num_heads);
        let group = h / kvh;
        let mut out = vec![f64::NAN; self.q.len()];
        for s in &self.seqs {
            let gather = |cache: &[f32]| -> Vec<f64> {
                let mut dense = Vec::with_capacity(s.context_len * kvh * d);
                for p in 0..s.context_len {
                    let slot = l.slot(s.page_table[p / l.page_size], p % l.page_size);
                    let row = &cache[slot * l.slot_len()..(slot + 1) * l.slot_len()];
                    dense.extend(row.iter().map(|&x| x as f64));
                }
                dense
            };
            let (k, v) = (gather(&meant(&self.k, Role::K, d)), gather(&meant(&self.v, Role::V, d)));
            for i in 0..s.query_len {
                let pos = s.context_len - s.query_len + i;
                let row = s.query_start + i;
                for head in 0..h {
                    let g = head / group;
                    let q = &self.q[(row * h + head) * d..][..d];
                    let scores: Vec<f64> = (0..=pos)
                        .map(|p| {
                            let kr = &k[(p * kvh + g) * d..][..d];
                            q.iter().zip(kr).map(|(a, b)| *a as f64 * b).sum::<f64>() * self.scale as f64
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = w.iter().sum();
                    for e in 0..d {
                        let acc: f64 = (0..=pos).map(|p| w[p] * v[(p * kvh + g) * d + e]).sum();
                        out[(row * h + head) * d + e] = acc / z;
                    }
                }
            }
        }
        out
    }
}

/// Max |a - b| over all elements; NaN anywhere counts as infinite error.
fn max_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let e = (*x as f64 - y).abs();
            if e.is_nan() { f64::INFINITY } else { e }
        })
        .fold(0.0, f64::max)
}

/// Which of K and V a cache holds: they rotate by Hadamard blocks of their own sizes.
#[derive(Clone, Copy)]
enum Role {
    K,
    V,
}

impl Role {
    fn block(self, head_dim: usize) -> usize {
        match self {
            Role::K => k_rotation_block(head_dim),
            Role::V => v_rotation_block(head_dim),
        }
    }
}

/// The values units of `T` stand for: as stored, rotated back for the types kept in the
/// Hadamard basis.
fn meant<T: KvElement>(units: &[T], role: Role, head_dim: usize) -> Vec<f32> {
    let mut values = kv_to_f32(units);
    if T::ROTATED {
        hadamard_rotate(&mut values, role.block(head_dim));
    }
    values
}

/// `values` (rows of heads) stored as units of `T` the way [`write_kv`] stores them.
fn as_stored<T: KvElement>(values: &[f32], role: Role, head_dim: usize) -> Vec<T> {
    let mut values = values.to_vec();
    if T::ROTATED {
        hadamard_rotate(&mut values, role.block(head_dim));
    }
    kv_from_f32(&values)
}

const HEAD_DIMS: [usize; 4] = [8, 64, 80, 128];
const HEADS: [(usize, usize); 5] = [(4, 4), (8, 2), (9, 3), (14, 2), (16, 8)];
const PAGE_SIZES: [usize; 3] = [1, 3, 16];

/// A batch mixing decode rows, prefill chunks after a cached context, and a
/// fresh prefill; context lengths from 1 to ~300.
fn mixed_shapes(rng: &mut Rng) -> Vec<(usize, usize)> {
    let mut shapes = vec![(1, 1)];
    for _ in 0..2 {
        shapes.push((rng.range(2, 300), 1));
    }
    let q = rng.range(2, 40);
    shapes.push((q + rng.range(1, 260), q));
    let q = rng.range(1, 40);
    shapes.push((q, q));
    shapes.push((rng.range(9, 17), rng.range(8, 9)));
    shapes
}

/// Runs every geometry for one storage type, checking `max_err <= tol(ref)`.
fn check_all_geometries<T: KvElement>(seed: u64, tol: impl Fn(f64) -> f64) {
    check_geometries::<T, T>(&HEAD_DIMS, seed, tol);
}

/// [`check_all_geometries`] over `head_dims`, with K and V of their own types.
fn check_geometries<K: KvElement, V: KvElement>(head_dims: &[usize], seed: u64, tol: impl Fn(f64) -> f64) {
    let mut rng = Rng(seed);
    let mut checked = 0;
    for &d in head_dims {
        for &heads in &HEADS {
            for &ps in &PAGE_SIZES {
                let shapes = mixed_shapes(&mut rng);
                let case = Case::<K, V>::random(&mut rng, d, heads, ps, &shapes);
                let got = case.run();
                let want = case.reference();
                let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                let err = max_err(&got, &want);
                assert!(
                    err <= tol(scale),
                    "head_dim {d}, heads {heads:?}, page_size {ps}, shapes {shapes:?}: max err {err:e} (output scale {scale})"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, head_dims.len() * HEADS.len() * PAGE_SIZES.len());
}

/// Head sizes a block of 32 divides (every Qwen and Llama model's).
const BLOCK_HEAD_DIMS: [usize; 3] = [32, 64, 128];

#[test]
fn q8_0_and_q4_0_match_reference_from_quantized_kv() {
    // The reference reads the same dequantized K/V, so only f32 arithmetic differs.
    check_geometries::<KvQ8_0, KvQ8_0>(&BLOCK_HEAD_DIMS, 4, |_| 1e-4);
    check_geometries::<KvQ4_0, KvQ4_0>(&BLOCK_HEAD_DIMS, 5, |_| 1e-4);
    check_geometries::<KvQ8_0, KvQ4_0>(&BLOCK_HEAD_DIMS, 6, |_| 1e-4);
    check_geometries::<f16, KvQ8_0>(&BLOCK_HEAD_DIMS, 7, |_| 1e-4);
}

/// Attention over quantized K/V stays near attention over the values before quantizing: what
/// the formats cost a layer's output on random rows (the model-level cost is the KL table in
/// benches/README.md).
#[test]
fn quantized_kv_stays_near_f32_kv() {
    for (seed, (name, bound)) in [("q8_0", 0.02), ("q4_0", 0.2)].into_iter().enumerate() {
        let mut rng = Rng(60 + seed as u64);
        let shapes = [(300, 1), (120, 40)];
        let exact = Case::<f32>::random(&mut rng, 128, (8, 2), 16, &shapes);
        let (k, v) = (exact.k.clone(), exact.v.clone());
        let got = if name == "q8_0" {
            Case::<KvQ8_0> { k: as_stored(&k, Role::K, 128), v: as_stored(&v, Role::V, 128), ..exact.with_types() }
                .run()
        } else {
            Case::<KvQ4_0> { k: as_stored(&k, Role::K, 128), v: as_stored(&v, Role::V, 128), ..exact.with_types() }
                .run()
        };
        let err = max_err(&got, &exact.reference());
        assert!(err < bound, "{name}: max |err| {err}");
    }
}

/// A trained model's K has outlier channels. Rotated into the Hadamard basis first, q4_0 K
/// keeps the attention that the same blocks lose unrotated (each block's scale then follows its
/// outlier and the other values round to a few steps).
#[test]
fn rotated_q4_0_keeps_attention_over_k_with_outlier_channels() {
    let mut rng = Rng(71);
    let d = 64;
    let shapes = [(300, 1), (120, 40)];
    let mut exact = Case::<f32>::random(&mut rng, d, (8, 2), 16, &shapes);
    // Two channels of every head 16x the others, as in Qwen2.5's K.
    for (i, x) in exact.k.iter_mut().enumerate() {
        if matches!(i % d, 5 | 37) {
            *x *= 16.0;
        }
    }
    exact.q.iter_mut().for_each(|x| *x *= 0.25);
    let want = exact.reference();
    let rotated =
        Case::<KvQ4_0, f32> { k: as_stored(&exact.k, Role::K, d), v: exact.v.clone(), ..exact.with_types() }.run();
    let unrotated = kv_to_f32(&kv_from_f32::<KvQ4_0>(&exact.k));
    let plain = Case::<f32> { k: unrotated, v: exact.v.clone(), ..exact.with_types() }.run();
    let mean_err =
        |got: &[f32]| got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).sum::<f64>() / want.len() as f64;
    let (rotated_err, plain_err) = (mean_err(&rotated), mean_err(&plain));
    assert!(rotated_err * 2.0 < plain_err, "mean |err| rotated {rotated_err:e}, unrotated {plain_err:e}");
}

#[test]
fn a_head_that_is_not_whole_blocks_is_refused() {
    let layout = PagedLayout { num_kv_heads: 1, head_dim: 40, page_size: 2, num_pages: 2 };
    let k = vec![KvQ8_0::ZERO; 4];
    let v = vec![0.0f32; layout.layer_len()];
    let q = vec![0.0f32; 40];
    let mut out = vec![0.0f32; 40];
    let seq = SequenceAttention { query_start: 0, query_len: 1, context_len: 1, page_table: &[0] };
    let err = paged_attention(&layout, 1, 1.0, &q, &k, &v, &[seq], &mut out).unwrap_err();
    assert_eq!(err, KernelError::HeadNotWholeBlocks { head_dim: 40, block: 32 });
    assert!(err.to_string().contains("f16"), "{err}");
    let (mut k, mut v2) = (k.clone(), v.clone());
    assert!(write_kv(&layout, &q, &q, &[0], &mut k, &mut v2).is_err());
}

#[test]
fn f32_matches_reference_on_all_geometries() {
    // 1e-5 relative to the output scale (at least 1).
    check_all_geometries::<f32>(1, |scale| 1e-5 * scale.max(1.0));
}

#[test]
fn f16_matches_reference_from_rounded_kv() {
    // The reference reads the same rounded K/V, so only f32 arithmetic differs.
    check_all_geometries::<f16>(2, |_| 1e-4);
}

#[test]
fn bf16_matches_reference_from_rounded_kv() {
    check_all_geometries::<bf16>(3, |_| 1e-4);
}

#[test]
fn odd_and_large_head_dims_match_reference() {
    // 1 and 5: no full 8-lane chunk; 300: 37 chunks and a tail of 4.
    let mut rng = Rng(4);
    for d in [1, 5, 300] {
        for ps in [1, 5] {
            let shapes = [(37, 1), (40, 19), (9, 9)];
            let case = Case::<f32>::random(&mut rng, d, (6, 3), ps, &shapes);
            let want = case.reference();
            let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            let err = max_err(&case.run(), &want);
            assert!(err <= 1e-5 * scale, "head_dim {d}, page_size {ps}: {err:e}");
            // f16 and bf16 rows of these lengths end in a partial 8-lane chunk.
            let case = Case::<f16>::random(&mut rng, d, (6, 3), ps, &shapes);
            let err = max_err(&case.run(), &case.reference());
            assert!(err <= 1e-4, "f16, head_dim {d}, page_size {ps}: {err:e}");
            let case = Case::<bf16>::random(&mut rng, d, (6, 3), ps, &shapes);
            let err = max_err(&case.run(), &case.reference());
            assert!(err <= 1e-4, "bf16, head_dim {d}, page_size {ps}: {err:e}");
        }
    }
}

#[test]
fn large_gqa_groups_match_reference() {
    // Groups of 20 to 56 query heads per kv head; 56 is more than one task's
    // 48 rows, so a group is split across tasks (56 = 48 + 8).
    let mut rng = Rng(8);
    for heads in [(20, 1), (32, 1), (40, 2), (56, 1), (112, 2)] {
        let shapes = [(23, 1), (30, 6), (4, 1)];
        let case = Case::<f32>::random(&mut rng, 8, heads, 3, &shapes);
        let want = case.reference();
        let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let err = max_err(&case.run(), &want);
        assert!(err <= 1e-5 * scale, "heads {heads:?}: {err:e}");
    }
}

#[test]
fn huge_logits_stay_finite() {
    // Scores up to 900 (exp overflows f32 past 88) that peak at random
    // positions, so the running maximum must be raised and the state
    // rescaled tile by tile. Scores are exact in f32 (multiples of 9.375), so
    // the f32 tolerance applies.
    let mut rng = Rng(9);
    let mut case = Case::<f32>::random(&mut rng, 16, (4, 2), 3, &[(300, 1), (280, 24)]);
    for (i, x) in case.k.iter_mut().enumerate() {
        if i % 16 == 0 {
            *x = (i / case.layout.slot_len() % 97) as f32 * 0.125;
        }
    }
    for (i, x) in case.q.iter_mut().enumerate() {
        *x = if i % 16 == 0 { 300.0 } else { 0.0 };
    }
    case.scale = 0.25;
    let got = case.run();
    assert!(got.iter().all(|x| x.is_finite()));
    let want = case.reference();
    let err = max_err(&got, &want);
    assert!(err <= 1e-5, "max err {err:e}");
}

#[test]
fn prefill_shapes_match_reference() {
    // The serving shapes: f16 KV, pages of 16, head_dim 64 (SmolLM2: 9 heads
    // over 3 kv heads) and 128 (Qwen3: 16 over 8; also groups of 4 and 8),
    // long prefills: a fresh one, a chunk after a cached context, next to a
    // decode row. Many tiles per row, partially masked diagonal tiles.
    let mut rng = Rng(10);
    for (d, heads) in [(64, (9, 3)), (128, (16, 8)), (128, (16, 4)), (64, (16, 2))] {
        let case = Case::<f16>::random(&mut rng, d, heads, 16, &[(150, 150), (181, 70), (97, 1)]);
        let err = max_err(&case.run(), &case.reference());
        assert!(err <= 1e-4, "head_dim {d}, heads {heads:?}: max err {err:e}");
    }
}

#[test]
fn result_does_not_depend_on_thread_count() {
    // Small batches get smaller tasks on bigger pools; every row's arithmetic
    // is the same either way, so outputs are bitwise equal.
    let mut rng = Rng(5);
    let cases = [
        Case::<f32>::random(&mut rng, 64, (8, 2), 3, &[(200, 1), (150, 37), (30, 30), (5, 1)]),
        Case::<f32>::random(&mut rng, 16, (14, 2), 4, &[(90, 1)]),
        Case::<f32>::random(&mut rng, 16, (32, 1), 1, &[(50, 3)]),
        Case::<f32>::random(&mut rng, 13, (6, 2), 5, &[(77, 11)]),
    ];
    let bits = |xs: Vec<f32>| xs.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    for case in &cases {
        let runs: Vec<_> = [1, 3, 16]
            .iter()
            .map(|&n| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
                bits(pool.install(|| case.run()))
            })
            .collect();
        assert_eq!(runs[0], runs[1]);
        assert_eq!(runs[0], runs[2]);
    }
    // f16 serving shapes whose small batches make bigger pools cut a group
    // of 3 (or 2) heads into tasks of other token counts (16 x 3 rows, 24 x
    // 2, 48 x 1), so tiles past a task's end are padded differently.
    let cases = [
        Case::<f16>::random(&mut rng, 64, (9, 3), 16, &[(100, 9), (40, 1)]),
        Case::<f16>::random(&mut rng, 128, (16, 8), 16, &[(70, 30)]),
        Case::<f16>::random(&mut rng, 64, (9, 3), 16, &[(30, 30)]),
    ];
    for case in &cases {
        let runs: Vec<_> = [1, 2, 3, 16]
            .iter()
            .map(|&n| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
                bits(pool.install(|| case.run()))
            })
            .collect();
        assert!(runs.iter().all(|r| *r == runs[0]));
    }
}

#[test]
fn rows_outside_every_sequence_are_untouched() {
    let mut rng = Rng(6);
    let mut case = Case::<f32>::random(&mut rng, 8, (4, 2), 2, &[(10, 3), (7, 2)]);
    let row_len = 4 * 8;
    // Insert two spare rows: one before everything, one between the sequences.
    for s in &mut case.seqs {
        s.query_start += if s.query_start == 0 { 1 } else { 2 };
    }
    let n_rows = 2 + 5;
    case.q = rng.vec(n_rows * row_len, 3.0);
    let mut out = vec![-7.0f32; n_rows * row_len];
    let views: Vec<_> = case.seqs.iter().map(Seq::view).collect();
    paged_attention(&case.layout, 4, case.scale, &case.q, &case.k, &case.v, &views, &mut out).unwrap();
    let mut covered = vec![false; n_rows];
    for s in &case.seqs {
        covered[s.query_start..s.query_start + s.query_len].fill(true);
    }
    assert_eq!(covered.iter().filter(|c| !**c).count(), 2);
    let want = case.reference();
    for (row, &c) in covered.iter().enumerate() {
        let got = &out[row * row_len..(row + 1) * row_len];
        if c {
            assert!(max_err(got, &want[row * row_len..(row + 1) * row_len]) <= 1e-5);
        } else {
            assert!(got.iter().all(|&x| x == -7.0), "row {row} was written");
        }
    }
}

/// Single sequence attention, one chunk vs random chunks with K/V written
/// progressively (the chunks on a pool of `threads`): the outputs of both,
/// as bits.
fn chunked_vs_whole<T: KvElement>(
    head_dim: usize,
    heads: (usize, usize),
    page_size: usize,
    len: usize,
    cuts: &[usize],
    threads: usize,
    seed: u64,
) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng(seed);
    let (num_heads, num_kv_heads) = heads;
    let n_pages = len.div_ceil(page_size);
    let layout = PagedLayout { num_kv_heads, head_dim, page_size, num_pages: n_pages + 2 };
    let mut page_table: Vec<u32> = (0..layout.num_pages as u32).collect();
    rng.shuffle(&mut page_table);
    page_table.truncate(n_pages);
    let slots: Vec<u32> = (0..len).map(|p| layout.slot(page_table[p / page_size], p % page_size) as u32).collect();
    let slot_len = layout.slot_len();
    let row_len = num_heads * head_dim;
    let k_new = rng.vec(len * slot_len, 1.0);
    let v_new = rng.vec(len * slot_len, 1.0);
    let q = rng.vec(len * row_len, 3.0);
    let scale = 1.0 / (head_dim as f32).sqrt();
    let fresh = || vec![T::ZERO; layout.layer_len() / T::VALUES];

    let (mut k, mut v) = (fresh(), fresh());
    write_kv(&layout, &k_new, &v_new, &slots, &mut k, &mut v).unwrap();
    let mut whole = vec![0.0f32; q.len()];
    let seq = SequenceAttention { query_start: 0, query_len: len, context_len: len, page_table: &page_table };
    paged_attention(&layout, num_heads, scale, &q, &k, &v, &[seq], &mut whole).unwrap();

    let (mut k, mut v) = (fresh(), fresh());
    let mut chunked = vec![0.0f32; q.len()];
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % len).filter(|&c| c > 0).collect();
    bounds.push(0);
    bounds.push(len);
    bounds.sort_unstable();
    bounds.dedup();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    for w in bounds.windows(2) {
        let (a, b) = (w[0], w[1]);
        write_kv(
            &layout,
            &k_new[a * slot_len..b * slot_len],
            &v_new[a * slot_len..b * slot_len],
            &slots[a..b],
            &mut k,
            &mut v,
        )
        .unwrap();
        let seq = SequenceAttention { query_start: 0, query_len: b - a, context_len: b, page_table: &page_table };
        let out = &mut chunked[a * row_len..b * row_len];
        pool.install(|| paged_attention(&layout, num_heads, scale, &q[a * row_len..b * row_len], &k, &v, &[seq], out))
            .unwrap();
    }
    let bits = |xs: Vec<f32>| xs.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    (bits(chunked), bits(whole))
}

/// Decode steps and short prefills after a long prompt, on pools whose
/// threads make decode split the context into chunks, give bitwise the
/// outputs of one prefill of everything: a token computed by a decode step
/// (or a full-hit recompute) equals the same token computed cold.
#[test]
fn decode_over_split_contexts_equals_one_prefill() {
    /// (head_dim, (heads, kv heads), page size, length, cuts, threads)
    type SplitCase = (usize, (usize, usize), usize, usize, Vec<usize>, usize);
    let cases: [SplitCase; 4] = [
        // SmolLM2's heads, one prompt of 600 then 40 decode steps.
        (64, (9, 3), 16, 640, (600..640).collect(), 2),
        // Qwen3-0.6B's heads on a 4-thread pool, a chunk boundary crossed mid-prefill.
        (128, (16, 8), 16, 530, vec![250, 262, 263, 264, 520, 521], 4),
        // Page size 1 and an odd head dim, decode right across 256 and 512.
        (20, (6, 2), 1, 520, vec![254, 255, 256, 257, 258, 511, 512, 513], 3),
        // No GQA, every token decoded.
        (8, (2, 2), 5, 300, (1..300).collect(), 2),
    ];
    for (i, (d, heads, page, len, cuts, threads)) in cases.into_iter().enumerate() {
        let (chunked, whole) = chunked_vs_whole::<f16>(d, heads, page, len, &cuts, threads, 40 + i as u64);
        let diff = chunked.iter().zip(&whole).filter(|(a, b)| a != b).count();
        assert_eq!(diff, 0, "case {i}: {diff} of {} outputs differ", whole.len());
        if d % 32 == 0 {
            let (chunked, whole) = chunked_vs_whole::<KvQ8_0>(d, heads, page, len, &cuts, threads, 50 + i as u64);
            assert!(chunked == whole, "q8_0, case {i}");
            let (chunked, whole) = chunked_vs_whole::<KvQ4_0>(d, heads, page, len, &cuts, threads, 60 + i as u64);
            assert!(chunked == whole, "q4_0, case {i}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// One chunk vs random chunks: bitwise equal.
    #[test]
    fn chunking_does_not_change_outputs(
        head_dim in prop::sample::select(vec![1usize, 8, 13, 64, 80]),
        heads in prop::sample::select(HEADS.to_vec()),
        page_size in 1usize..=17,
        len in 1usize..=90,
        cuts in prop::collection::vec(0usize..1000, 0..8),
        threads in 1usize..=4,
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let (chunked, whole) = if bf {
            chunked_vs_whole::<bf16>(head_dim, heads, page_size, len, &cuts, threads, seed)
        } else {
            chunked_vs_whole::<f32>(head_dim, heads, page_size, len, &cuts, threads, seed)
        };
        prop_assert!(chunked == whole);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Random geometry and batch (decode rows and prefill chunks) against the
    /// f64 reference: max |err| <= 1e-5 * max(1, max |ref|).
    #[test]
    fn random_batches_match_reference(
        head_dim in 1usize..=24,
        num_kv_heads in 1usize..=3,
        group in 1usize..=9,
        page_size in 1usize..=9,
        shapes in prop::collection::vec((0usize..60, 1usize..=20), 1..5),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        // (cached tokens, new tokens) -> (context_len, query_len)
        let shapes: Vec<_> = shapes.iter().map(|&(c, q)| (c + q, q)).collect();
        let case = Case::<f32>::random(&mut rng, head_dim, (num_kv_heads * group, num_kv_heads), page_size, &shapes);
        let want = case.reference();
        let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let err = max_err(&case.run(), &want);
        prop_assert!(err <= 1e-5 * scale, "max err {err:e}");
    }
}

/// Reads back a slot's K and V as f32.
fn read_slot<T: KvElement>(layout: &PagedLayout, cache: &[T], slot: usize) -> Vec<f32> {
    let units = layout.slot_len() / T::VALUES;
    kv_to_f32(&cache[slot * units..(slot + 1) * units])
}

fn write_then_read_back<T: KvElement>(head_dim: usize) {
    let mut rng = Rng(7);
    let layout = PagedLayout { num_kv_heads: 3, head_dim, page_size: 4, num_pages: 5 };
    let sentinel = kv_from_f32::<T>(&vec![42.0; T::VALUES])[0];
    // 42 as the type stores it (a q8_0 scale rounds to f16).
    let stored = kv_to_f32(&[sentinel])[0];
    let mut k = vec![sentinel; layout.layer_len() / T::VALUES];
    let mut v = vec![sentinel; layout.layer_len() / T::VALUES];
    // Slot 6 twice: the later row wins.
    let slots = [19u32, 0, 6, 13, 6];
    let k_new = rng.vec(slots.len() * layout.slot_len(), 2.0);
    let v_new = rng.vec(slots.len() * layout.slot_len(), 2.0);
    write_kv(&layout, &k_new, &v_new, &slots, &mut k, &mut v).unwrap();
    // The units as stored: rotated first for the types kept in the Hadamard basis.
    let round = |xs: &[f32], role| kv_to_f32(&as_stored::<T>(xs, role, head_dim));
    for (row, &slot) in slots.iter().enumerate() {
        if row == 2 {
            continue;
        }
        let src = row * layout.slot_len()..(row + 1) * layout.slot_len();
        assert_eq!(read_slot(&layout, &k, slot as usize), round(&k_new[src.clone()], Role::K));
        assert_eq!(read_slot(&layout, &v, slot as usize), round(&v_new[src], Role::V));
    }
    for slot in 0..layout.num_pages * layout.page_size {
        if !slots.contains(&(slot as u32)) {
            assert!(read_slot(&layout, &k, slot).iter().all(|&x| x == stored));
            assert!(read_slot(&layout, &v, slot).iter().all(|&x| x == stored));
        }
    }
    assert_eq!(layout.slot(3, 1), 13);
}

#[test]
fn write_kv_reads_back_f32() {
    write_then_read_back::<f32>(10);
}

#[test]
fn write_kv_reads_back_f16() {
    write_then_read_back::<f16>(10);
}

#[test]
fn write_kv_reads_back_bf16() {
    write_then_read_back::<bf16>(10);
}

#[test]
fn write_kv_reads_back_q8_0_and_q4_0() {
    write_then_read_back::<KvQ8_0>(64);
    write_then_read_back::<KvQ4_0>(32);
}
