//! Causal attention over the paged KV pool (CPU, multi-threaded with rayon).
//!
//! Flash-attention style: a task takes a block of query rows (query tokens x
//! query heads of one GQA group), walks the context in tiles of [`TILE`]
//! positions and runs register-blocked kernels ([`tile`]) for the tile's
//! scores and weighted sum of all rows, with an online softmax per row in
//! between. Tasks of many rows (prefill) convert each tile's K and V rows to
//! f32 once into scratch; tasks of few rows (decode) read the pool in place
//! (f16, bf16, f32, q8_0 and q4_0 blocks, asking the cache for the next tile's
//! rows ahead) and convert in registers. The online softmax restarts every [`CHUNK`]
//! positions and the chunks' states are merged ([`partial`]), so a long
//! context can be split across threads without changing any result.

use std::borrow::Cow;
use std::cell::RefCell;
use std::marker::PhantomData;

use rayon::prelude::*;

use crate::vector::scale;
use crate::{KernelError, KvElement, PagedLayout, hadamard_rotate, k_rotation_block, v_rotation_block};

mod partial;
mod plan;
mod source;
mod tile;
mod validate;

use partial::{PartialBuf, finish_row, merge_partial};
use plan::Plan;
use source::{Converted, InPlace, PageWalk, TileSource};
use tile::{MAX_IN_PLACE_ROW, TILE};
use validate::validate;
#[cfg(feature = "cuda")]
pub(crate) use validate::validate_sequences;

/// Context positions per chunk: the online softmax of every row restarts at
/// each multiple of `CHUNK` and the chunks' partial states are merged in
/// order. Fixed (not derived from the thread count or page size) so that
/// results are the same however the context is split.
const CHUNK: usize = 256;

/// Most rows of a task that reads K/V in place (converting in registers as
/// the kernels load them); larger tasks convert each tile once into scratch,
/// which their many rows then share.
const IN_PLACE_MAX_ROWS: usize = 12;

/// Most query rows (query token x query head of one GQA group) one task
/// scores against each K/V tile: every K/V row read from the pool (and
/// converted, for f16/bf16) serves up to this many queries. 48 = 16 tokens
/// of a 3-head group or 24 of a 2-head group; the task's scratch (queries and
/// accumulators of 48 rows, one K and one V tile) is 40 KiB at head_dim 64,
/// 64 KiB at 128; still ~5% faster than 24 rows on a 2-core AMD EPYC.
const MAX_ROWS: usize = 48;

/// Scratch floats of a task: scaled queries, the chunk's and the merged
/// accumulators for `rows` query rows, plus one converted K tile and one
/// converted V tile.
const fn scratch_len(rows: usize, head_dim: usize) -> usize {
    (3 * rows + 2 * TILE) * head_dim
}

thread_local! {
    /// Per-thread task scratch, grown on demand: tasks never nest, so one
    /// buffer per thread suffices and no task pays for zeroing it.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One sequence of the batch.
#[derive(Clone, Copy, Debug)]
pub struct SequenceAttention<'a> {
    /// Index of this sequence's first new token among the batch's rows of `q`/`out`.
    pub query_start: usize,
    /// Number of new tokens (>= 1).
    pub query_len: usize,
    /// Tokens in its context INCLUDING the new ones; the new tokens are the
    /// last `query_len` positions.
    pub context_len: usize,
    /// Pages holding positions `0..context_len` in order: position `p` is in
    /// `page_table[p / page_size]` at offset `p % page_size`. Entries beyond
    /// `ceil(context_len / page_size)` are ignored.
    pub page_table: &'a [u32],
}

/// Causal attention of the batch's new tokens over each sequence's paged context.
///
/// `q`: `[n_rows, num_heads, head_dim]` f32; `out`: same shape. Token `i` of a
/// sequence (absolute position `context_len - query_len + i`) attends to
/// positions `0..=` that position, so the K/V of the new tokens must already
/// be in the pool ([`write_kv`](crate::write_kv)). GQA: query head `h` reads
/// kv head `h / (num_heads / num_kv_heads)`, never materializing repeated
/// K/V. Online (streaming) softmax with f32 accumulation; `scale` multiplies
/// `q · k` (usually `1 / sqrt(head_dim)`).
///
/// K/V are read in place through the page table (no gather copy of the
/// context: tasks of many rows convert each tile of 16 positions to f32 into
/// per-thread scratch, tasks of few rows convert in registers). Runs in
/// parallel with rayon on the *current* rayon pool (the caller owns a pool
/// and calls `pool.install`), over tasks of (sequence, block of query tokens,
/// query heads of one GQA group): each K/V tile loaded serves up to 48
/// (token, head) query rows, and tiles past a block's last token (causal
/// mask) are never read. When the batch is too small to keep the pool busy
/// (decode), long contexts are split into chunks of 256 positions, one task
/// each, whose softmax states are merged after; short ones are split into
/// fewer heads per task. A row's result does not depend on the number of
/// threads nor on which other rows share the batch (bitwise, for finite
/// inputs): a token computed in a decode step equals the same token computed
/// in a prefill. CPUs with AVX2+FMA use fused multiply-adds, so their
/// results differ from the portable build's in rounding only.
///
/// For K (or V) stored in the Hadamard basis ([`KvElement::ROTATED`]: the quantized types),
/// the queries are rotated before scoring (and the output rotated back), so the result is
/// attention over the values that were given to [`write_kv`](crate::write_kv).
///
/// Rows of `out` that belong to no sequence are left untouched. All inputs
/// are validated first; on `Err` nothing is written.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<K: KvElement, V: KvElement>(
    layout: &PagedLayout,
    num_heads: usize,
    scale: f32,
    q: &[f32],
    k_cache: &[K],
    v_cache: &[V],
    seqs: &[SequenceAttention],
    out: &mut [f32],
) -> Result<(), KernelError> {
    run_attention(layout, num_heads, scale, q, k_cache, v_cache, seqs, out, Isa::detect())
}

/// The instruction set the attention kernels are built for. One process
/// always uses the same one, so its results are reproducible; the builds
/// round differently from one another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Isa {
    /// Plain Rust, vectorized by the compiler for the target's baseline.
    Portable,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 + FMA + F16C, with the score and weighted-sum kernels on
    /// AVX-512F (16 lanes).
    Avx512,
}

impl Isa {
    /// The best set this CPU supports (detection is cached by `std`).
    pub(crate) fn detect() -> Isa {
        if !crate::cpu::has_avx2_fma_f16c() {
            Isa::Portable
        } else if crate::cpu::has_avx512f() {
            Isa::Avx512
        } else {
            Isa::Avx2
        }
    }

    /// Every set this CPU supports, worst first (for tests).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512].into_iter().filter(|&isa| isa <= Isa::detect()).collect()
    }
}

/// Whether the CPU supports AVX2, FMA and F16C: every x86_64 CPU with AVX2
/// has the other two, the AVX2 path uses all three.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn has_avx2() -> bool {
    Isa::detect() != Isa::Portable
}

/// [`paged_attention`] with the instruction set chosen by the caller, which
/// the CPU must support (anything but `Portable` is ignored off x86_64).
#[allow(clippy::too_many_arguments)]
fn run_attention<K: KvElement, V: KvElement>(
    layout: &PagedLayout,
    num_heads: usize,
    scale: f32,
    q: &[f32],
    k_cache: &[K],
    v_cache: &[V],
    seqs: &[SequenceAttention],
    out: &mut [f32],
    isa: Isa,
) -> Result<(), KernelError> {
    validate(layout, num_heads, scale, q, k_cache, v_cache, seqs, out)?;
    let head_dim = layout.head_dim;
    let q = if K::ROTATED {
        // K holds `H k`: `(H q) · (H k)` is the score `q · k`.
        let mut rotated = q.to_vec();
        let block = k_rotation_block(head_dim);
        rotated.par_chunks_mut(num_heads * head_dim).for_each(|row| hadamard_rotate(row, block));
        Cow::Owned(rotated)
    } else {
        Cow::Borrowed(q)
    };
    attend_batch(layout, num_heads, scale, &q, k_cache, v_cache, seqs, out, isa)?;
    if V::ROTATED {
        // V holds `H v`: the weighted sum is `H` of the one wanted, and `H` is its own inverse.
        let (row_len, block) = (num_heads * head_dim, v_rotation_block(head_dim));
        for seq in seqs {
            let rows = &mut out[seq.query_start * row_len..(seq.query_start + seq.query_len) * row_len];
            rows.par_chunks_mut(row_len).for_each(|row| hadamard_rotate(row, block));
        }
    }
    Ok(())
}

/// [`run_attention`] over validated inputs, with queries and output in the basis K and V are
/// stored in.
#[allow(clippy::too_many_arguments)]
fn attend_batch<K: KvElement, V: KvElement>(
    layout: &PagedLayout,
    num_heads: usize,
    scale: f32,
    q: &[f32],
    k_cache: &[K],
    v_cache: &[V],
    seqs: &[SequenceAttention],
    out: &mut [f32],
    isa: Isa,
) -> Result<(), KernelError> {
    let group = num_heads / layout.num_kv_heads;
    let plan = Plan::new(layout.num_kv_heads, group, seqs, rayon::current_num_threads());
    let ctx = Ctx {
        page_size: layout.page_size,
        slot_len: layout.slot_len(),
        head_dim: layout.head_dim,
        num_heads,
        group,
        plan,
        isa,
        scale,
        q,
        k_cache,
        v_cache,
        out: OutPtr::new(out),
    };
    let units = layout.num_kv_heads * plan.head_chunks;
    if !plan.split {
        seqs.par_iter().for_each(|seq| {
            let tasks = plan.blocks(seq) * units;
            (0..tasks).into_par_iter().for_each(|task| ctx.run(seq, task / units, task % units, None));
        });
        return Ok(());
    }

    // One task per chunk of context, then a fold of each row's chunks.
    let slots_of = |seq: &SequenceAttention| seq.query_len * num_heads * seq.context_len.div_ceil(CHUNK);
    let floats = seqs
        .iter()
        .try_fold(0usize, |n, seq| slots_of(seq).checked_mul(layout.head_dim + 2)?.checked_add(n))
        .ok_or(KernelError::InvalidLayout("attention partial states overflow usize"))?;
    partial::with_buffers(floats, seqs.len(), |buf, offsets| {
        let mut next = 0;
        for (offset, seq) in offsets.iter_mut().zip(seqs) {
            *offset = next;
            next += slots_of(seq);
        }
        let partials = PartialBuf::new(buf, layout.head_dim);
        let offsets = &*offsets;
        seqs.par_iter().zip(offsets).for_each(|(seq, &offset)| {
            let tasks = plan.blocks(seq) * units;
            (0..tasks).into_par_iter().for_each(|task| {
                let (block, unit) = (task / units, task % units);
                (0..plan.chunks(seq, block)).into_par_iter().for_each(|chunk| {
                    ctx.run(seq, block, unit, Some(Split { chunk, partials: &partials, offset }));
                });
            });
        });
        seqs.par_iter().zip(offsets).for_each(|(seq, &offset)| {
            (0..seq.query_len).into_par_iter().for_each(|t| ctx.fold_partials(seq, t, &partials, offset));
        });
    });
    Ok(())
}

/// The chunk a task of a split call covers, and where its rows' partial
/// states go.
#[derive(Clone, Copy)]
struct Split<'p, 'b> {
    chunk: usize,
    partials: &'p PartialBuf<'b>,
    /// The sequence's first slot in `partials`.
    offset: usize,
}

/// One task: its sequence, its query rows and, in a split call, its chunk.
#[derive(Clone, Copy)]
struct Task<'s, 'p, 'b> {
    seq: &'s SequenceAttention<'s>,
    rows: Rows,
    split: Option<Split<'p, 'b>>,
}

/// `out` shared by the parallel tasks, each writing its own disjoint rows.
struct OutPtr<'a> {
    ptr: *mut f32,
    len: usize,
    _out: PhantomData<&'a mut [f32]>,
}

// SAFETY: `OutPtr` is only used to hand out disjoint sub-slices of one
// `&mut [f32]` to tasks on other threads (see `OutPtr::slice`).
unsafe impl Send for OutPtr<'_> {}
// SAFETY: as above; shared access only ever creates non-overlapping slices.
unsafe impl Sync for OutPtr<'_> {}

impl<'a> OutPtr<'a> {
    /// Takes over `out` for the lifetime of the tasks.
    fn new(out: &'a mut [f32]) -> Self {
        Self { ptr: out.as_mut_ptr(), len: out.len(), _out: PhantomData }
    }

    /// `out[start..start + len]`, mutably.
    ///
    /// # Safety
    /// No two live slices returned by this function may overlap. Callers
    /// guarantee it by writing only `out[row, h0..h0 + heads, ..]` for the
    /// rows of their own (sequence, token block) and their own head range;
    /// sequences' rows are validated to be disjoint.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start <= self.len && len <= self.len - start);
        // SAFETY: in bounds (asserted above); disjointness is the caller's
        // obligation, and `_out` keeps the original borrow alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// Inputs shared by every task of one [`paged_attention`] call.
struct Ctx<'a, K, V> {
    page_size: usize,
    slot_len: usize,
    head_dim: usize,
    num_heads: usize,
    group: usize,
    plan: Plan,
    /// The build of the inner loops (only `Portable` is used off x86_64).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    isa: Isa,
    scale: f32,
    q: &'a [f32],
    k_cache: &'a [K],
    v_cache: &'a [V],
    out: OutPtr<'a>,
}

/// The query rows of one task: tokens `t0..t0 + tokens` of a sequence times
/// query heads `h0..h0 + heads` (all reading kv head `kv_head`), ordered
/// token-major: row `r` is token `t0 + r / heads`, head `h0 + r % heads`.
#[derive(Clone, Copy, Debug)]
struct Rows {
    t0: usize,
    tokens: usize,
    h0: usize,
    heads: usize,
    kv_head: usize,
}

impl Rows {
    fn len(&self) -> usize {
        self.tokens * self.heads
    }
}

impl<K: KvElement, V: KvElement> Ctx<'_, K, V> {
    /// One task: token block `block` of `seq`, head chunk `unit` (kv head
    /// `unit / head_chunks`), over the whole context or, in a split call,
    /// over one chunk of it.
    fn run(&self, seq: &SequenceAttention, block: usize, unit: usize, split: Option<Split>) {
        let plan = self.plan;
        let kv_head = unit / plan.head_chunks;
        let first_head = (unit % plan.head_chunks) * plan.heads;
        let t0 = block * plan.tokens;
        debug_assert!(t0 < seq.query_len && first_head < self.group);
        let rows = Rows {
            t0,
            tokens: plan.tokens.min(seq.query_len - t0),
            h0: kv_head * self.group + first_head,
            heads: plan.heads.min(self.group - first_head),
            kv_head,
        };
        let len = scratch_len(rows.len(), self.head_dim);
        SCRATCH.with(|cell| {
            // A task never starts another one on this thread (no rayon calls
            // inside), so the scratch is never borrowed twice.
            let mut scratch = cell.borrow_mut();
            if scratch.len() < len {
                scratch.resize(len, 0.0);
            }
            self.attend_dispatch(Task { seq, rows, split }, &mut scratch[..len]);
        });
    }

    /// Runs [`attend`](Self::attend) compiled for the best instruction set
    /// the CPU has, reading K/V in place when the task has few rows.
    #[inline(always)]
    fn attend_dispatch(&self, task: Task, scratch: &mut [f32]) {
        let Task { seq, rows, .. } = task;
        let d = self.head_dim;
        let (work, tiles) = scratch.split_at_mut(3 * rows.len() * d);
        let (kt, vt) = tiles.split_at_mut(TILE * d);
        let walk = PageWalk {
            page_table: seq.page_table,
            page_size: self.page_size,
            slot_len: self.slot_len,
            kv_off: rows.kv_head * d,
            end: seq.context_len - seq.query_len + rows.t0 + rows.tokens,
            d,
        };
        let in_place = rows.len() <= IN_PLACE_MAX_ROWS && d <= MAX_IN_PLACE_ROW;
        #[cfg(target_arch = "x86_64")]
        if self.isa != Isa::Portable {
            if !(in_place && self.attend_in_place::<true>(task, work, walk)) {
                let mut src = Converted::<K, V, true> { k: self.k_cache, v: self.v_cache, walk, kt, vt };
                self.attend_isa::<true, _>(task, work, &mut src);
            }
            return;
        }
        if !(in_place && self.attend_in_place::<false>(task, work, walk)) {
            let mut src = Converted::<K, V, false> { k: self.k_cache, v: self.v_cache, walk, kt, vt };
            self.attend_isa::<false, _>(task, work, &mut src);
        }
    }

    /// Runs [`attend`](Self::attend) over the pool read in place, if `K` and `V` are
    /// one of the types the kernels read directly; false if not.
    #[inline(always)]
    fn attend_in_place<const AVX2: bool>(&self, task: Task, work: &mut [f32], walk: PageWalk) -> bool {
        let (k, v) = (self.k_cache, self.v_cache);
        // The pairs people run (llama-server's `-ctk`/`-ctv` with f16, q8_0, q4_0; bf16 and
        // f32 alone); other mixes are converted into scratch.
        if let (Some(k), Some(v)) = (K::as_f16_slice(k), V::as_f16_slice(v)) {
            self.attend_isa::<AVX2, _>(task, work, &mut InPlace { k, v, walk });
        } else if let (Some(k), Some(v)) = (K::as_q8_0_slice(k), V::as_q8_0_slice(v)) {
            self.attend_isa::<AVX2, _>(task, work, &mut InPlace { k, v, walk });
        } else if let (Some(k), Some(v)) = (K::as_q4_0_slice(k), V::as_q4_0_slice(v)) {
            self.attend_isa::<AVX2, _>(task, work, &mut InPlace { k, v, walk });
        } else if let (Some(k), Some(v)) = (K::as_q8_0_slice(k), V::as_q4_0_slice(v)) {
            self.attend_isa::<AVX2, _>(task, work, &mut InPlace { k, v, walk });
        } else if let (Some(k), Some(v)) = (K::as_f16_slice(k), V::as_q8_0_slice(v)) {
            self.attend_isa::<AVX2, _>(task, work, &mut InPlace { k, v, walk });
        } else if let (Some(k), Some(v)) = (K::as_bf16_slice(k), V::as_bf16_slice(v)) {
            self.attend_isa::<AVX2, _>(task, work, &mut InPlace { k, v, walk });
        } else if let (Some(k), Some(v)) = (K::as_f32_slice(k), V::as_f32_slice(v)) {
            self.attend_isa::<AVX2, _>(task, work, &mut InPlace { k, v, walk });
        } else {
            return false;
        }
        true
    }

    /// [`attend`](Self::attend) in the AVX2 build (`AVX2`, x86_64 only,
    /// where `isa` is AVX2 or better) or the portable one.
    #[inline(always)]
    fn attend_isa<const AVX2: bool, S: TileSource>(&self, task: Task, work: &mut [f32], src: &mut S) {
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            debug_assert!(self.isa != Isa::Portable);
            // SAFETY: callers set `AVX2` only when `isa` is AVX2 or better,
            // i.e. the CPU supports AVX2, FMA and F16C (`run_attention`'s
            // contract).
            unsafe { self.attend_avx2(task, work, src) };
            return;
        }
        self.attend::<false, S>(task, work, src);
    }

    /// [`attend`](Self::attend) with 256-bit vectors and fused multiply-adds.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn attend_avx2<S: TileSource>(&self, task: Task, work: &mut [f32], src: &mut S) {
        self.attend::<true, S>(task, work, src);
    }

    /// Attention of one task's query rows, with a streaming softmax over
    /// tiles of [`TILE`] context positions that restarts every [`CHUNK`]
    /// positions; the chunks' states are merged here (whole context) or
    /// stored for [`fold_partials`](Self::fold_partials) (split call).
    ///
    /// Results do not depend on the plan: every row goes through the same
    /// operations whatever rows share its task and wherever its tiles come
    /// from (conversions to f32 are exact). A row takes part in exactly the
    /// tiles from position 0 up to the one holding its own position, each
    /// over all [`TILE`] columns (later positions masked to weight 0), and
    /// rows that see nothing of a tile skip it entirely.
    #[inline(always)]
    fn attend<const AVX2: bool, S: TileSource>(&self, task: Task, work: &mut [f32], src: &mut S) {
        let Task { seq, rows, split } = task;
        let d = self.head_dim;
        let n = rows.len();
        debug_assert!((1..=MAX_ROWS).contains(&n));
        debug_assert_eq!(work.len(), 3 * n * d);
        let (qs, rest) = work.split_at_mut(n * d);
        let (acc, merged) = rest.split_at_mut(n * d);
        // The AVX-512 score and weighted-sum kernels (only with AVX2 set).
        let wide = AVX2 && self.isa == Isa::Avx512;

        // Token t of the task sits at absolute position `first + t` and
        // attends to positions 0..=first + t.
        let first = seq.context_len - seq.query_len + rows.t0;
        let end = first + rows.tokens;
        debug_assert!(end <= seq.context_len);

        for t in 0..rows.tokens {
            let row = seq.query_start + rows.t0 + t;
            let src = &self.q[(row * self.num_heads + rows.h0) * d..][..rows.heads * d];
            let dst = &mut qs[t * rows.heads * d..][..rows.heads * d];
            for (dst, x) in dst.iter_mut().zip(src) {
                *dst = x * self.scale;
            }
        }
        // The current chunk's softmax state, and the merged state of the
        // chunks before it.
        let mut max = [f32::NEG_INFINITY; MAX_ROWS];
        let mut sum = [0.0f32; MAX_ROWS];
        let mut run_max = [f32::NEG_INFINITY; MAX_ROWS];
        let mut run_sum = [0.0f32; MAX_ROWS];
        let mut weights = [[0.0f32; TILE]; MAX_ROWS];

        let chunks = match split {
            Some(s) => s.chunk..s.chunk + 1,
            None => 0..end.div_ceil(CHUNK),
        };
        for c in chunks {
            let (c0, c1) = (c * CHUNK, ((c + 1) * CHUNK).min(end));
            // Rows of tokens before `c0 - first` see none of this chunk.
            let seen = c0.saturating_sub(first) * rows.heads;
            debug_assert!(seen < n);
            acc[seen * d..].fill(0.0);
            max[seen..n].fill(f32::NEG_INFINITY);
            sum[seen..n].fill(0.0);
            for t0 in (c0..c1).step_by(TILE) {
                // Rows of tokens before `t0 - first` see none of this tile.
                let vis = t0.saturating_sub(first) * rows.heads;
                let (kt, vt) = src.rows(t0);
                let w = &mut weights[vis..n];
                tile::scores::<AVX2, S::KElem>(&qs[vis * d..], &kt, d, w, wide);
                for (r, tile) in (vis..n).zip(w.iter_mut()) {
                    // Mask the positions after this row's own.
                    let last = first + r / rows.heads;
                    if last < t0 + TILE - 1 {
                        tile[last + 1 - t0..].fill(f32::NEG_INFINITY);
                    }
                    if let Some(corr) = tile::online_softmax::<AVX2>(tile, &mut max[r], &mut sum[r]) {
                        scale(&mut acc[r * d..(r + 1) * d], corr);
                    }
                }
                tile::weighted_sum::<AVX2, S::VElem>(w, &vt, d, &mut acc[vis * d..], wide);
            }
            for r in seen..n {
                let chunk_acc = &acc[r * d..(r + 1) * d];
                match split {
                    Some(s) => {
                        let (t, h) = (rows.t0 + r / rows.heads, rows.h0 + r % rows.heads);
                        // SAFETY: slot (token t, head h, chunk c) of this
                        // sequence is written by this task only, and read
                        // only after every task has finished.
                        let slot = unsafe { s.partials.slot_mut(s.offset + self.partial_index(seq, t, h, c)) };
                        slot[0] = max[r];
                        slot[1] = sum[r];
                        slot[2..].copy_from_slice(chunk_acc);
                    }
                    None => {
                        let run_acc = &mut merged[r * d..(r + 1) * d];
                        merge_partial(&mut run_max[r], &mut run_sum[r], run_acc, max[r], sum[r], chunk_acc);
                    }
                }
            }
        }
        if split.is_some() {
            return;
        }

        for t in 0..rows.tokens {
            let row = seq.query_start + rows.t0 + t;
            // SAFETY: out[row, h0..h0 + heads, ..] belongs to this task only:
            // rows of different sequences are disjoint (validated), token
            // blocks of one sequence are disjoint, and head ranges of the
            // tasks of one block are disjoint.
            let dst = unsafe { self.out.slice((row * self.num_heads + rows.h0) * d, rows.heads * d) };
            for (hh, dst) in dst.chunks_exact_mut(d).enumerate() {
                let r = t * rows.heads + hh;
                dst.copy_from_slice(&merged[r * d..(r + 1) * d]);
                finish_row(dst, run_sum[r]);
            }
        }
    }

    /// Slot of (token `t`, head `h`, chunk `c`) of `seq` among the
    /// sequence's partial states.
    fn partial_index(&self, seq: &SequenceAttention, t: usize, h: usize, c: usize) -> usize {
        (t * self.num_heads + h) * seq.context_len.div_ceil(CHUNK) + c
    }

    /// The output rows of token `t` of `seq` in a split call: every head's
    /// partial states folded in chunk order, as [`attend`](Self::attend)
    /// folds them when one task walks the whole context.
    fn fold_partials(&self, seq: &SequenceAttention, t: usize, partials: &PartialBuf, offset: usize) {
        let d = self.head_dim;
        let position = seq.context_len - seq.query_len + t;
        let row = seq.query_start + t;
        // SAFETY: out[row] is this fold's alone: rows of different sequences
        // are disjoint (validated) and each token of a sequence is folded once.
        let dst = unsafe { self.out.slice(row * self.num_heads * d, self.num_heads * d) };
        for (h, out) in dst.chunks_exact_mut(d).enumerate() {
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
            for c in 0..=position / CHUNK {
                // SAFETY: every task has finished; folds only read.
                let slot = unsafe { partials.slot(offset + self.partial_index(seq, t, h, c)) };
                merge_partial(&mut max, &mut sum, out, slot[0], slot[1], &slot[2..]);
            }
            finish_row(out, sum);
        }
    }
}

#[cfg(test)]
mod tests;
