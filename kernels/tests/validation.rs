//! Every validation error path of `paged_attention` and `write_kv` returns
//! `Err` (never panics, never writes), and random malformed inputs never panic.

use half::f16;
use proptest::prelude::*;
use radix_kernels::{KernelError, PagedLayout, SequenceAttention, paged_attention, write_kv};

const LAYOUT: PagedLayout = PagedLayout { num_kv_heads: 2, head_dim: 4, page_size: 3, num_pages: 4 };
const HEADS: usize = 4;
const ROW: usize = HEADS * 4;
const ROWS: usize = 5;

/// Owned arguments of one `paged_attention` call, valid until mutated.
#[derive(Clone)]
struct Args {
    layout: PagedLayout,
    num_heads: usize,
    scale: f32,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// (query_start, query_len, context_len, page_table)
    seqs: Vec<(usize, usize, usize, Vec<u32>)>,
    out_len: usize,
}

impl Args {
    fn valid() -> Self {
        Args {
            layout: LAYOUT,
            num_heads: HEADS,
            scale: 0.5,
            q: vec![0.1; ROWS * ROW],
            k: vec![0.2; LAYOUT.layer_len()],
            v: vec![0.3; LAYOUT.layer_len()],
            // Prefill chunk of 2 after 3 cached tokens, a decode row, and a
            // fresh prefill of 2 listed before the decode row (unsorted rows).
            seqs: vec![(0, 2, 5, vec![1, 3]), (4, 1, 3, vec![0]), (2, 2, 2, vec![2, 9])],
            out_len: ROWS * ROW,
        }
    }

    /// Runs the call; on `Err` also checks that `out` was not written.
    fn run(&self) -> Result<(), KernelError> {
        let seqs: Vec<_> = self
            .seqs
            .iter()
            .map(|(s, l, c, p)| SequenceAttention { query_start: *s, query_len: *l, context_len: *c, page_table: p })
            .collect();
        let mut out = vec![-3.0f32; self.out_len];
        let r = paged_attention(&self.layout, self.num_heads, self.scale, &self.q, &self.k, &self.v, &seqs, &mut out);
        if r.is_err() {
            assert!(out.iter().all(|&x| x == -3.0), "out written on error");
        }
        r
    }

    fn with(f: impl FnOnce(&mut Args)) -> Result<(), KernelError> {
        let mut a = Args::valid();
        f(&mut a);
        a.run()
    }
}

#[test]
fn valid_arguments_pass() {
    // Page 9 of the last table lies beyond what its context needs: ignored.
    assert_eq!(Args::valid().run(), Ok(()));
    assert_eq!(Args::with(|a| a.seqs.clear()), Ok(()));
}

#[test]
fn layout_errors() {
    use KernelError::InvalidLayout;
    assert!(matches!(Args::with(|a| a.layout.num_kv_heads = 0), Err(InvalidLayout(_))));
    assert!(matches!(Args::with(|a| a.layout.head_dim = 0), Err(InvalidLayout(_))));
    assert!(matches!(Args::with(|a| a.layout.page_size = 0), Err(InvalidLayout(_))));
    assert!(matches!(Args::with(|a| a.layout.num_pages = usize::MAX / 2), Err(InvalidLayout(_))));
}

#[test]
fn head_and_scale_errors() {
    assert!(matches!(Args::with(|a| a.num_heads = 0), Err(KernelError::HeadsNotMultiple { .. })));
    assert!(matches!(Args::with(|a| a.num_heads = 3), Err(KernelError::HeadsNotMultiple { .. })));
    assert!(matches!(Args::with(|a| a.scale = f32::NAN), Err(KernelError::NonFiniteScale(_))));
    assert!(matches!(Args::with(|a| a.scale = f32::INFINITY), Err(KernelError::NonFiniteScale(_))));
}

#[test]
fn slice_length_errors() {
    let what = |r: Result<(), KernelError>| match r {
        Err(KernelError::LengthMismatch { what, .. }) => what,
        other => panic!("expected LengthMismatch, got {other:?}"),
    };
    assert_eq!(what(Args::with(|a| _ = a.k.pop())), "k_cache");
    assert_eq!(what(Args::with(|a| a.v.push(0.0))), "v_cache");
    assert_eq!(what(Args::with(|a| a.out_len -= ROW)), "out");
    assert!(matches!(Args::with(|a| _ = a.q.pop()), Err(KernelError::RaggedRows { .. })));
}

#[test]
fn sequence_errors() {
    use KernelError::*;
    assert_eq!(Args::with(|a| a.seqs[1].1 = 0), Err(EmptyQuery { seq: 1 }));
    assert!(matches!(Args::with(|a| a.seqs[0].2 = 1), Err(ContextShorterThanQuery { seq: 0, .. })));
    assert!(matches!(Args::with(|a| a.seqs[1].0 = ROWS), Err(QueryRowsOutOfBounds { seq: 1, .. })));
    assert!(matches!(
        Args::with(|a| {
            a.seqs[0].1 = ROWS + 1;
            a.seqs[0].2 = ROWS + 1;
        }),
        Err(QueryRowsOutOfBounds { seq: 0, .. })
    ));
    assert!(matches!(Args::with(|a| a.seqs[1].0 = usize::MAX), Err(QueryRowsOutOfBounds { seq: 1, .. })));
    assert!(matches!(Args::with(|a| a.seqs[0].2 = 7), Err(PageTableTooShort { seq: 0, needed: 3, .. })));
    assert!(matches!(Args::with(|a| a.seqs[1].3.clear()), Err(PageTableTooShort { seq: 1, .. })));
    assert!(matches!(Args::with(|a| a.seqs[0].3[1] = 4), Err(PageOutOfRange { seq: 0, index: 1, page: 4, .. })));
    assert!(matches!(Args::with(|a| a.seqs[1].3[0] = u32::MAX), Err(PageOutOfRange { seq: 1, .. })));
}

#[test]
fn overlapping_rows_are_rejected() {
    use KernelError::QueryRowsOverlap;
    // Unsorted batch (sorting path): seq 0 covers rows 0..2, seq 2 now 1..3.
    assert_eq!(Args::with(|a| a.seqs[2].0 = 1), Err(QueryRowsOverlap { first: 0, second: 2 }));
    // Sorted batch (linear path).
    assert_eq!(
        Args::with(|a| a.seqs = vec![(0, 2, 5, vec![1, 3]), (1, 1, 3, vec![0])]),
        Err(QueryRowsOverlap { first: 0, second: 1 })
    );
    // Same start.
    assert!(matches!(
        Args::with(|a| a.seqs = vec![(2, 1, 3, vec![0]), (2, 1, 3, vec![0])]),
        Err(QueryRowsOverlap { .. })
    ));
}

#[test]
fn write_kv_errors_and_no_partial_write() {
    let l = LAYOUT;
    let sl = l.slot_len();
    let (k_new, v_new) = (vec![1.0f32; 2 * sl], vec![2.0f32; 2 * sl]);
    let mut k = vec![f16::from_f32(0.0); l.layer_len()];
    let mut v = k.clone();
    let untouched = |k: &[f16], v: &[f16]| k.iter().chain(v).all(|x| x.to_f32() == 0.0);

    let bad = PagedLayout { page_size: 0, ..l };
    assert!(matches!(write_kv(&bad, &k_new, &v_new, &[0, 1], &mut k, &mut v), Err(KernelError::InvalidLayout(_))));
    let r = write_kv(&l, &k_new[1..], &v_new, &[0, 1], &mut k, &mut v);
    assert!(matches!(r, Err(KernelError::LengthMismatch { what: "k_new", .. })));
    let r = write_kv(&l, &k_new, &v_new[..sl], &[0, 1], &mut k, &mut v);
    assert!(matches!(r, Err(KernelError::LengthMismatch { what: "v_new", .. })));
    let r = write_kv(&l, &k_new, &v_new, &[0, 1], &mut k[1..], &mut v);
    assert!(matches!(r, Err(KernelError::LengthMismatch { what: "k_cache", .. })));
    let mut v_long = vec![f16::from_f32(0.0); l.layer_len() + 1];
    let r = write_kv(&l, &k_new, &v_new, &[0, 1], &mut k, &mut v_long);
    assert!(matches!(r, Err(KernelError::LengthMismatch { what: "v_cache", .. })));
    // A valid slot before the bad one must not be written either.
    let num_slots = l.num_pages * l.page_size;
    let r = write_kv(&l, &k_new, &v_new, &[0, num_slots as u32], &mut k, &mut v);
    assert_eq!(r, Err(KernelError::SlotOutOfRange { row: 1, slot: num_slots as u32, num_slots }));
    assert!(untouched(&k, &v));
    assert_eq!(write_kv(&l, &k_new, &v_new, &[0, 11], &mut k, &mut v), Ok(()));
    assert!(!untouched(&k, &v));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random, mostly malformed arguments: `paged_attention` returns `Ok` or
    /// `Err` without panicking (and never writes `out` on `Err`).
    #[test]
    fn random_arguments_never_panic(
        kvh in 0usize..4, d in 0usize..5, ps in 0usize..4, pages in 0usize..5,
        num_heads in 0usize..7,
        scale in prop::sample::select(vec![0.5f32, 0.0, f32::NAN, f32::NEG_INFINITY]),
        rows in 0usize..6,
        deltas in prop::collection::vec(prop::sample::select(vec![0isize, 0, 0, 1, -1]), 4),
        seqs in prop::collection::vec(
            (0usize..7, 0usize..5, 0usize..12, prop::collection::vec(0u32..6, 0..6)),
            0..4,
        ),
    ) {
        let layout = PagedLayout { num_kv_heads: kvh, head_dim: d, page_size: ps, num_pages: pages };
        let len = |base: usize, delta: isize| base.saturating_add_signed(delta);
        let layer = layout.layer_len();
        let q_len = len(rows * num_heads * d, deltas[0]);
        let a = Args {
            layout,
            num_heads,
            scale,
            q: vec![0.7; q_len],
            k: vec![-0.4; len(layer, deltas[1])],
            v: vec![0.9; len(layer, deltas[2])],
            seqs,
            out_len: len(q_len, deltas[3]),
        };
        let _ = a.run();

        // write_kv with the same geometry.
        let sl = layout.slot_len();
        let slots: Vec<u32> = a.seqs.iter().flat_map(|s| s.3.iter().copied()).collect();
        let mut k = vec![0.0f32; len(layer, deltas[1])];
        let mut v = vec![0.0f32; len(layer, deltas[2])];
        let new = vec![1.0f32; len(slots.len() * sl, deltas[3])];
        let new_v = vec![1.0f32; slots.len() * sl];
        if write_kv(&layout, &new, &new_v, &slots, &mut k, &mut v).is_err() {
            prop_assert!(k.iter().chain(&v).all(|&x| x == 0.0));
        }
    }
}
