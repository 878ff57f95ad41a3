//! The attention kernels of every ISA against each other and against the portable build.

use super::*;

/// Every build agrees with the portable one to rounding: max |diff| <=
/// 1e-5 on outputs of magnitude <= 1, for each K/V type (the tests in
/// `tests/` exercise whichever this CPU picks against an f64 reference).
#[test]
fn every_isa_agrees_with_the_portable_build() {
    paths_agree::<f32, f32>();
    paths_agree::<half::f16, half::f16>();
    paths_agree::<half::bf16, half::bf16>();
    paths_agree::<crate::KvQ8_0, crate::KvQ8_0>();
    paths_agree::<crate::KvQ4_0, crate::KvQ4_0>();
    paths_agree::<crate::KvQ8_0, crate::KvQ4_0>();
    paths_agree::<half::f16, crate::KvQ8_0>();
    paths_agree::<half::f16, crate::KvQ4_0>();
}

/// A head size the types allow: 76 (scalar column tails) for the float types, 96 for blocks.
fn head_dim<K: KvElement, V: KvElement>(float: usize) -> usize {
    if K::VALUES.max(V::VALUES) > 1 { 96 } else { float }
}

/// `values` as [`write_kv`](crate::write_kv) stores them: rotated first by Hadamard blocks of
/// `block` for the types kept in that basis, so attention reads `values` back.
fn stored<T: KvElement>(mut values: Vec<f32>, block: usize) -> Vec<T> {
    if T::ROTATED {
        crate::hadamard_rotate(&mut values, block);
    }
    crate::kv_from_f32(&values)
}

fn paths_agree<K: KvElement, V: KvElement>() {
    let layout = PagedLayout { num_kv_heads: 2, head_dim: head_dim::<K, V>(76), page_size: 5, num_pages: 80 };
    let wave = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).sin()).collect::<Vec<f32>>();
    let k: Vec<K> = stored(wave(layout.layer_len(), 0.37), crate::k_rotation_block(layout.head_dim));
    let v: Vec<V> = stored(wave(layout.layer_len(), 0.11), crate::v_rotation_block(layout.head_dim));
    let num_heads = 6;
    let rows = 1 + 21 + 1;
    let q = wave(rows * num_heads * layout.head_dim, 0.73);
    let table_a: Vec<u32> = (0..80).rev().collect();
    let table_b: Vec<u32> = (0..80).map(|p| (p * 7) % 80).collect();
    let seqs = [
        SequenceAttention { query_start: 0, query_len: 1, context_len: 390, page_table: &table_a },
        SequenceAttention { query_start: 1, query_len: 21, context_len: 64, page_table: &table_b },
        SequenceAttention { query_start: 22, query_len: 1, context_len: 1, page_table: &table_b },
    ];
    let run = |isa: Isa| {
        let mut out = vec![0.0f32; q.len()];
        run_attention(&layout, num_heads, 0.2, &q, &k, &v, &seqs, &mut out, isa).unwrap();
        out
    };
    let portable = run(Isa::Portable);
    let name = std::any::type_name::<(K, V)>();
    for isa in Isa::available() {
        let fast = run(isa);
        let err = portable.iter().zip(&fast).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err <= 1e-5, "{name}: max |{isa:?} - portable| = {err:e}");
        // A weighted mean of V values in [-1, 1], give or take V's rounding: rotated back, the
        // rounding of a block (up to a sixteenth of its range for q4_0) spreads over its head.
        let bound = if V::ROTATED { 1.25 } else { 1.0 };
        let max = fast.iter().fold(0.0f32, |m, x| if x.is_finite() { m.max(x.abs()) } else { f32::INFINITY });
        assert!(max <= bound, "{name} {isa:?}: max |out| {max}");
    }
}

/// Every build gives bitwise equal results whatever the plan: a small
/// prefill on 1 thread (tasks of 16 tokens x 3 heads) and on 16 (1 head x
/// 48 tokens), with odd head_dim 20 (vector and scalar column paths).
#[test]
fn every_isa_is_plan_independent() {
    let layout = PagedLayout { num_kv_heads: 2, head_dim: 20, page_size: 16, num_pages: 8 };
    let wave = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).sin()).collect::<Vec<f32>>();
    let k = wave(layout.layer_len(), 0.37);
    let v = wave(layout.layer_len(), 0.11);
    let num_heads = 6;
    let q = wave(40 * num_heads * layout.head_dim, 0.73);
    let table: Vec<u32> = (0..8).rev().collect();
    let seqs = [SequenceAttention { query_start: 0, query_len: 40, context_len: 90, page_table: &table }];
    let run = |isa: Isa, threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut out = vec![0.0f32; q.len()];
        pool.install(|| run_attention(&layout, num_heads, 0.2, &q, &k, &v, &seqs, &mut out, isa)).unwrap();
        out.into_iter().map(f32::to_bits).collect::<Vec<_>>()
    };
    let plans = |threads| Plan::new(layout.num_kv_heads, 3, &seqs, threads);
    assert_ne!(plans(1).tokens, plans(16).tokens);
    for isa in Isa::available() {
        assert_eq!(run(isa, 1), run(isa, 16), "{isa:?}");
    }
}

/// In every build, the last tokens of a prompt computed one by one as
/// decode steps (tasks of few rows reading the pool in place, long
/// contexts split into chunks on a 4-thread pool) equal bitwise the same
/// tokens computed in one prefill (tasks of 48 rows converting tiles into
/// scratch, one task per context), for f16, bf16, f32 and block-quantized pools (read in
/// place by decode for the pairs `attend_in_place` names, converted for the others).
#[test]
fn decode_steps_equal_prefill_in_every_isa() {
    decode_equals_prefill::<half::f16, half::f16>();
    decode_equals_prefill::<half::bf16, half::bf16>();
    decode_equals_prefill::<f32, f32>();
    decode_equals_prefill::<crate::KvQ8_0, crate::KvQ8_0>();
    decode_equals_prefill::<crate::KvQ4_0, crate::KvQ4_0>();
    decode_equals_prefill::<crate::KvQ8_0, half::f16>();
    decode_equals_prefill::<crate::KvQ8_0, crate::KvQ4_0>();
    decode_equals_prefill::<half::f16, crate::KvQ8_0>();
}

fn decode_equals_prefill<K: KvElement, V: KvElement>() {
    // Head dim 72: the 64-lane, 16-lane (AVX-512) or 8-lane and scalar column paths.
    let layout = PagedLayout { num_kv_heads: 2, head_dim: head_dim::<K, V>(72), page_size: 16, num_pages: 40 };
    let wave = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).sin()).collect::<Vec<f32>>();
    let k: Vec<K> = stored(wave(layout.layer_len(), 0.37), crate::k_rotation_block(layout.head_dim));
    let v: Vec<V> = stored(wave(layout.layer_len(), 0.11), crate::v_rotation_block(layout.head_dim));
    let (num_heads, len, decoded) = (6, 600, 5);
    let row = num_heads * layout.head_dim;
    let q = wave(len * row, 0.73);
    let table: Vec<u32> = (0..40).map(|p| (p * 11) % 40).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
    for isa in Isa::available() {
        let mut whole = vec![0.0f32; q.len()];
        let seq = SequenceAttention { query_start: 0, query_len: len, context_len: len, page_table: &table };
        pool.install(|| run_attention(&layout, num_heads, 0.1, &q, &k, &v, &[seq], &mut whole, isa)).unwrap();
        for t in len - decoded..len {
            let seq = SequenceAttention { query_start: 0, query_len: 1, context_len: t + 1, page_table: &table };
            let plan = Plan::new(layout.num_kv_heads, 3, &[seq], 4);
            assert!(plan.split && plan.heads <= IN_PLACE_MAX_ROWS, "{plan:?}");
            let mut one = vec![0.0f32; row];
            let q_t = &q[t * row..(t + 1) * row];
            pool.install(|| run_attention(&layout, num_heads, 0.1, q_t, &k, &v, &[seq], &mut one, isa)).unwrap();
            let want = &whole[t * row..(t + 1) * row];
            let same = one.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{isa:?} {}: token {t}", std::any::type_name::<(K, V)>());
        }
    }
}
