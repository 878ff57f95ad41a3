//! The delta rule and the convolution against their definitions, and the verify rule against
//! the in-place one.

use proptest::prelude::*;

use super::*;

fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 * 0.731 + seed).sin()) * 0.5).collect()
}

/// A convolution over rows split anywhere equals one over all rows at once, state included.
#[test]
fn convolution_in_pieces_equals_one_call() {
    let (channels, kernel, rows) = (5, 4, 9);
    let x = values(rows * channels, 0.3);
    let w = values(channels * kernel, 1.7);
    let mut state_once = values((kernel - 1) * channels, 2.1);
    let mut state_split = state_once.clone();
    let mut once = vec![0.0; x.len()];
    causal_conv1d_silu(&x, &w, kernel, &mut state_once, &mut once).unwrap();
    let mut split = vec![0.0; x.len()];
    for (a, b) in [(0, 1), (1, 3), (3, 9)] {
        let r = a * channels..b * channels;
        causal_conv1d_silu(&x[r.clone()], &w, kernel, &mut state_split, &mut split[r]).unwrap();
    }
    assert_eq!(once, split);
    assert_eq!(state_once, state_split);
    // The state holds the last three inputs.
    assert_eq!(state_once, x[(rows - 3) * channels..]);
}

proptest! {
    /// The delta rule over tokens split anywhere equals one call, and each value head reads
    /// the key head its order names.
    #[test]
    fn delta_rule_in_pieces_equals_one_call(rows in 1usize..12, split in 0usize..12, tiled: bool) {
        let split = split.min(rows);
        let shape = DeltaNetShape { num_key_heads: 2, num_value_heads: 4, key_dim: 3, value_dim: 5, tiled_value_heads: tiled };
        let q = values(rows * 6, 0.1);
        let k = values(rows * 6, 0.9);
        let v = values(rows * 20, 1.3);
        let g: Vec<f32> = values(rows * 4, 2.0).iter().map(|x| -x.abs()).collect();
        let beta: Vec<f32> = values(rows * 4, 3.0).iter().map(|x| 0.5 + x).collect();
        let mut s_once = values(shape.state_len(), 4.0);
        let mut s_split = s_once.clone();
        let mut once = vec![0.0; rows * 20];
        gated_delta_rule(&shape, &q, &k, &v, &g, &beta, &mut s_once, &mut once).unwrap();
        let mut out = vec![0.0; rows * 20];
        for (a, b) in [(0, split), (split, rows)] {
            if a == b { continue; }
            gated_delta_rule(&shape, &q[a * 6..b * 6], &k[a * 6..b * 6], &v[a * 20..b * 20], &g[a * 4..b * 4],
                &beta[a * 4..b * 4], &mut s_split, &mut out[a * 20..b * 20]).unwrap();
        }
        prop_assert_eq!(&once, &out);
        prop_assert_eq!(&s_once, &s_split);
    }
}

proptest! {
    /// The verify rule gives the in-place rule's outputs bit for bit and leaves the state
    /// where the in-place rule over its first `kept` rows leaves it, for decode-sized and
    /// prefill-sized spans, `kept` from none to all.
    #[test]
    fn verify_rule_equals_the_in_place_one(
        rows in 1usize..10,
        kept_at in any::<prop::sample::Index>(),
        dv in prop::sample::select(vec![5usize, 16, 20]),
    ) {
        let shape = DeltaNetShape { num_key_heads: 2, num_value_heads: 4, key_dim: 6, value_dim: dv, tiled_value_heads: false };
        let kept = kept_at.index(rows + 1);
        let q = values(rows * 12, 0.4);
        let k = values(rows * 12, 0.8);
        let v = values(rows * 4 * dv, 1.6);
        let g: Vec<f32> = values(rows * 4, 2.2).iter().map(|x| -x.abs()).collect();
        let beta: Vec<f32> = values(rows * 4, 3.3).iter().map(|x| 0.5 + x).collect();
        let before = values(shape.state_len(), 4.4);
        let mut advanced = before.clone();
        let (mut in_place, mut verified) = (vec![0.0; rows * 4 * dv], vec![1.0; rows * 4 * dv]);
        gated_delta_rule(&shape, &q, &k, &v, &g, &beta, &mut advanced, &mut in_place).unwrap();
        let mut kept_state = before.clone();
        let mut scratch = vec![0.0; kept * 4 * dv];
        gated_delta_rule(&shape, &q[..kept * 12], &k[..kept * 12], &v[..kept * 4 * dv], &g[..kept * 4],
            &beta[..kept * 4], &mut kept_state, &mut scratch).unwrap();
        let mut state = before.clone();
        gated_delta_rule_verify(&shape, kept, &q, &k, &v, &g, &beta, &mut state, &mut verified).unwrap();
        prop_assert_eq!(&in_place, &verified);
        prop_assert_eq!(&state, &kept_state);
        prop_assert_ne!(&advanced, &before);
        let mut state = before.clone();
        prop_assert!(gated_delta_rule_verify(&shape, rows + 1, &q, &k, &v, &g, &beta, &mut state, &mut verified).is_err());
    }
}

/// The textbook recurrence, one token and head at a time, on the whole state.
fn naive(
    shape: &DeltaNetShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
) -> Vec<f32> {
    let DeltaNetShape { num_key_heads: nk, num_value_heads: nv, key_dim: dk, value_dim: dv, .. } = *shape;
    let rows = g.len() / nv;
    let mut out = vec![0.0f32; rows * nv * dv];
    for t in 0..rows {
        for h in 0..nv {
            let kh = shape.key_head_of(h);
            let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
            let (qt, kt) = (&q[(t * nk + kh) * dk..][..dk], &k[(t * nk + kh) * dk..][..dk]);
            let decay = g[t * nv + h].exp();
            for x in s.iter_mut() {
                *x *= decay;
            }
            for j in 0..dv {
                let memory: f32 = (0..dk).map(|i| s[i * dv + j] * kt[i]).sum();
                let delta = (v[(t * nv + h) * dv + j] - memory) * beta[t * nv + h];
                for i in 0..dk {
                    s[i * dv + j] += kt[i] * delta;
                }
                out[(t * nv + h) * dv + j] = (0..dk).map(|i| s[i * dv + j] * qt[i]).sum();
            }
        }
    }
    out
}

proptest! {
    /// The blocked kernel computes the textbook recurrence, for value widths below, at and
    /// past a block, in either head order.
    #[test]
    fn delta_rule_matches_the_textbook_recurrence(rows in 1usize..6, dv in prop::sample::select(vec![3usize, 16, 24, 40]), tiled: bool) {
        let shape = DeltaNetShape { num_key_heads: 2, num_value_heads: 4, key_dim: 8, value_dim: dv, tiled_value_heads: tiled };
        let q = values(rows * 16, 0.2);
        let k = values(rows * 16, 0.7);
        let v = values(rows * 4 * dv, 1.1);
        let g: Vec<f32> = values(rows * 4, 2.5).iter().map(|x| -x.abs()).collect();
        let beta: Vec<f32> = values(rows * 4, 3.5).iter().map(|x| 0.5 + x).collect();
        let mut ours = values(shape.state_len(), 4.5);
        let mut theirs = ours.clone();
        let mut out = vec![0.0; rows * 4 * dv];
        gated_delta_rule(&shape, &q, &k, &v, &g, &beta, &mut ours, &mut out).unwrap();
        let want = naive(&shape, &q, &k, &v, &g, &beta, &mut theirs);
        for (a, b) in out.iter().zip(&want).chain(ours.iter().zip(&theirs)) {
            prop_assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}

/// One token from a zero state: `S = beta k v^T`, so `out = beta (k . q) v`.
#[test]
fn first_token_from_zero_state() {
    for tiled in [false, true] {
        let shape =
            DeltaNetShape { num_key_heads: 2, num_value_heads: 4, key_dim: 2, value_dim: 3, tiled_value_heads: tiled };
        let q = [1.0, 0.0, 0.0, 2.0];
        let k = [0.5, 0.5, 1.0, 1.0];
        let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let (g, beta) = ([-0.3; 4], [0.5; 4]);
        let mut state = vec![0.0; shape.state_len()];
        let mut out = vec![0.0; 12];
        gated_delta_rule(&shape, &q, &k, &v, &g, &beta, &mut state, &mut out).unwrap();
        for h in 0..4 {
            let kh = shape.key_head_of(h);
            let dot: f32 = (0..2).map(|i| q[kh * 2 + i] * k[kh * 2 + i]).sum();
            for j in 0..3 {
                assert!((out[h * 3 + j] - 0.5 * dot * v[h * 3 + j]).abs() < 1e-6, "tiled {tiled} head {h}");
            }
        }
        assert_eq!(shape.key_head_of(1), if tiled { 1 } else { 0 });
    }
}
