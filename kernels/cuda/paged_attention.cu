// Paged attention over radix-serve's KV pool, on NVIDIA GPUs.
//
// The pool layout is the CPU one (kernels/src/layout.rs): one layer's K (or V) is a row-major
// [num_pages, page_size, num_kv_heads, head_dim] array of values (f32, f16 or bf16), or of GGUF
// q8_0 / q4_0 blocks of 32 values (kv_formats.cuh); a sequence reaches its positions through
// its page table. Queries, new K/V rows and outputs are f32 ([rows, heads, head_dim]).
//
// Work split (DESIGN.md §3): a block owns one KV head and one *tile* of query rows of one
// sequence (up to ROWS rows = tokens x the query heads sharing that KV head, so GQA reads each
// K/V tile once for the whole group), and one *split* of the key range. Keys stream through
// shared memory KEYS at a time with an online softmax kept in registers. When a batch has too few
// tiles to fill the GPU (decode), the key range is split over several blocks and a second kernel
// merges their partial results (flash-decoding).
//
// The block formats hold each head rotated into the Hadamard basis: attention runs in that basis
// (the queries rotated first by radix_hadamard_heads for a rotated K, the output rotated back
// after for a rotated V), as the CPU path does.
//
// Softmax runs in base 2: queries are pre-multiplied by scale * log2(e).

#include "kv_formats.cuh"

#define WARPS 4
#define ROWS_PER_WARP 4
#define ROWS (WARPS * ROWS_PER_WARP)
#define KEYS 32
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// cache[slots[row] * slot_len + i] = rows[row * slot_len + i], one block per row.
template <typename T>
__device__ void write_kv(const float* rows, const uint32_t* slots, T* cache, uint32_t n_rows, uint32_t slot_len) {
    const uint32_t row = blockIdx.x;
    if (row >= n_rows) return;
    const size_t dst = (size_t)slots[row] * slot_len;
    const size_t src = (size_t)row * slot_len;
    for (uint32_t i = threadIdx.x; i < slot_len; i += blockDim.x) cache[dst + i] = from_f32<T>(rows[src + i]);
}

// One block per row: the row (slot_len floats of shared memory) rotated head by head in Hadamard
// blocks of `block`, then quantized 32 values at a time into the row's slot.
template <typename B>
__device__ void write_kv_blocks(const float* rows, const uint32_t* slots, uint8_t* cache, uint32_t n_rows,
                                uint32_t slot_len, uint32_t block, float norm) {
    extern __shared__ float x[];
    const uint32_t row = blockIdx.x;
    if (row >= n_rows) return;
    for (uint32_t i = threadIdx.x; i < slot_len; i += blockDim.x) x[i] = rows[(size_t)row * slot_len + i];
    hadamard_shared(x, slot_len, block, norm);
    const uint32_t blocks = slot_len / KV_BLOCK;
    for (uint32_t b = threadIdx.x; b < blocks; b += blockDim.x)
        KvFormat<B>::store(x + b * KV_BLOCK, cache + ((size_t)slots[row] * blocks + b) * KvFormat<B>::BYTES);
}

// Rotates each head of `src` (rows of head_dim floats, one block per head) into `dst`, which
// may be `src`: the queries into the basis a rotated K is stored in, or the output back from a
// rotated V's.
__device__ void hadamard_heads(const float* src, float* dst, uint32_t head_dim, uint32_t block, float norm) {
    extern __shared__ float x[];
    const size_t base = (size_t)blockIdx.x * head_dim;
    for (uint32_t i = threadIdx.x; i < head_dim; i += blockDim.x) x[i] = src[base + i];
    hadamard_shared(x, head_dim, block, norm);
    for (uint32_t i = threadIdx.x; i < head_dim; i += blockDim.x) dst[base + i] = x[i];
}

// Loads KEYS positions of one KV head of K (or V) into shared memory as f32, rows `STRIDE`
// floats apart, one CHUNK of a head per thread step. Positions at or past `key_end` read as
// zero (their scores are masked anyway).
template <typename T, int D, int STRIDE>
__device__ __forceinline__ void load_tile(const typename KvFormat<T>::Unit* __restrict__ cache,
                                          const uint32_t* __restrict__ page_table, uint32_t page_size,
                                          uint32_t num_kv_heads, uint32_t kv_head, uint32_t key_start,
                                          uint32_t key_end, float* dst) {
    constexpr int CHUNK = KvFormat<T>::CHUNK;
    constexpr int CHUNKS = D / CHUNK;
    static_assert(D % CHUNK == 0, "a head is whole chunks");
    for (int c = threadIdx.x; c < KEYS * CHUNKS; c += blockDim.x) {
        const int j = c / CHUNKS;
        const int d0 = (c % CHUNKS) * CHUNK;
        const uint32_t pos = key_start + j;
        float v[CHUNK];
        if (pos < key_end) {
            const uint32_t page = page_table[pos / page_size];
            const size_t slot = (size_t)page * page_size + pos % page_size;
            KvFormat<T>::load(cache, (slot * num_kv_heads + kv_head) * D + d0, v);
        } else {
#pragma unroll
            for (int e = 0; e < CHUNK; ++e) v[e] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < CHUNK; ++e) dst[j * STRIDE + d0 + e] = v[e];
    }
}

// seqs: 4 words per sequence (query_start, query_len, context_len, page_table_offset).
// tiles: 3 words per tile (sequence, first new token of the tile, tokens in the tile).
// With num_splits == 1 the normalized result goes to `out`; otherwise each block writes its
// unnormalized accumulator and (max, sum) to part_acc / part_ml for attention_combine.
template <typename KT, typename VT, int D>
__device__ void attention(const float* __restrict__ q, const typename KvFormat<KT>::Unit* __restrict__ k_cache,
                          const typename KvFormat<VT>::Unit* __restrict__ v_cache, const uint32_t* __restrict__ seqs,
                          const uint32_t* __restrict__ page_tables, const uint32_t* __restrict__ tiles,
                          float* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                          uint32_t num_heads, uint32_t num_kv_heads, uint32_t page_size, uint32_t partition,
                          uint32_t num_splits, float scale_log2) {
    // Dims per lane; with D = 16 the upper half of each warp owns none.
    constexpr int DPL = D >= 32 ? D / 32 : 1;
    extern __shared__ float smem[];
    float* q_s = smem;                  // [ROWS][D]
    float* k_s = q_s + ROWS * D;        // [KEYS][D + 1], padded so lanes read distinct banks
    float* v_s = k_s + KEYS * (D + 1);  // [KEYS][D]

    const uint32_t tile = blockIdx.x, split = blockIdx.y, kv_head = blockIdx.z;
    const uint32_t group = num_heads / num_kv_heads;
    const uint32_t seq = tiles[3 * tile], first_token = tiles[3 * tile + 1], n_tokens = tiles[3 * tile + 2];
    const uint32_t query_start = seqs[4 * seq], query_len = seqs[4 * seq + 1];
    const uint32_t context_len = seqs[4 * seq + 2];
    const uint32_t* page_table = page_tables + seqs[4 * seq + 3];
    const uint32_t n_rows = n_tokens * group;
    const uint32_t first_pos = context_len - query_len + first_token;

    for (int i = threadIdx.x; i < ROWS * D; i += blockDim.x) {
        const uint32_t r = i / D, d = i % D;
        float x = 0.0f;
        if (r < n_rows) {
            const uint32_t token = query_start + first_token + r / group;
            const uint32_t head = kv_head * group + r % group;
            x = q[((size_t)token * num_heads + head) * D + d] * scale_log2;
        }
        q_s[i] = x;
    }

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // Causal limit of each of this warp's rows: the row's own position (-1 for padding rows).
    int64_t row_pos[ROWS_PER_WARP];
#pragma unroll
    for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
        const uint32_t r = warp * ROWS_PER_WARP + rr;
        row_pos[rr] = r < n_rows ? (int64_t)(first_pos + r / group) : -1;
    }
    const uint32_t keys = first_pos + n_tokens;  // the tile's last row sees positions 0..keys-1
    const uint32_t key_begin = split * partition;
    const uint32_t key_end = min(key_begin + partition, keys);

    float m[ROWS_PER_WARP], l[ROWS_PER_WARP], acc[ROWS_PER_WARP][DPL];
#pragma unroll
    for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
        m[rr] = NEG_INF;
        l[rr] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[rr][i] = 0.0f;
    }
    __syncthreads();

    for (uint32_t key_start = key_begin; key_start < key_end; key_start += KEYS) {
        load_tile<KT, D, D + 1>(k_cache, page_table, page_size, num_kv_heads, kv_head, key_start, key_end, k_s);
        load_tile<VT, D, D>(v_cache, page_table, page_size, num_kv_heads, kv_head, key_start, key_end, v_s);
        __syncthreads();

        // Lane j scores key key_start + j against the warp's rows.
        float s[ROWS_PER_WARP];
#pragma unroll
        for (int rr = 0; rr < ROWS_PER_WARP; ++rr) s[rr] = 0.0f;
        const float* qw = q_s + warp * ROWS_PER_WARP * D;
#pragma unroll 8
        for (int d = 0; d < D; ++d) {
            const float kd = k_s[lane * (D + 1) + d];
#pragma unroll
            for (int rr = 0; rr < ROWS_PER_WARP; ++rr) s[rr] = fmaf(qw[rr * D + d], kd, s[rr]);
        }
        const int64_t pos = key_start + lane;
        float p[ROWS_PER_WARP];
#pragma unroll
        for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
            if (pos >= key_end || pos > row_pos[rr]) s[rr] = NEG_INF;
            const float m_new = fmaxf(m[rr], warp_max(s[rr]));
            if (m_new == NEG_INF) {  // nothing visible yet for this row (uniform across the warp)
                p[rr] = 0.0f;
                continue;
            }
            p[rr] = exp2f(s[rr] - m_new);
            const float correction = exp2f(m[rr] - m_new);
            l[rr] = l[rr] * correction + warp_sum(p[rr]);
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[rr][i] *= correction;
            m[rr] = m_new;
        }
        // Lane owns dims lane, lane + 32, ...; key j's weight comes from lane j.
#pragma unroll 4
        for (int j = 0; j < KEYS; ++j) {
            float vj[DPL];
#pragma unroll
            for (int i = 0; i < DPL; ++i) vj[i] = lane + 32 * i < D ? v_s[j * D + lane + 32 * i] : 0.0f;
#pragma unroll
            for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
                const float pj = __shfl_sync(0xffffffffu, p[rr], j);
#pragma unroll
                for (int i = 0; i < DPL; ++i) acc[rr][i] = fmaf(pj, vj[i], acc[rr][i]);
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int rr = 0; rr < ROWS_PER_WARP; ++rr) {
        const uint32_t r = warp * ROWS_PER_WARP + rr;
        if (r >= n_rows) continue;
        const size_t row_head =
            (size_t)(query_start + first_token + r / group) * num_heads + kv_head * group + r % group;
        if (num_splits == 1) {
            const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i)
                if (lane + 32 * i < D) out[row_head * D + lane + 32 * i] = acc[rr][i] * inv;
        } else {
            const size_t part = row_head * num_splits + split;
#pragma unroll
            for (int i = 0; i < DPL; ++i)
                if (lane + 32 * i < D) part_acc[part * D + lane + 32 * i] = acc[rr][i];
            if (lane == 0) {
                part_ml[2 * part] = m[rr];
                part_ml[2 * part + 1] = l[rr];
            }
        }
    }
}

// Merges the splits of one (row, head) per block; blockDim.x == head_dim.
__device__ void attention_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                  float* __restrict__ out, uint32_t num_splits, uint32_t head_dim) {
    const size_t row_head = blockIdx.x;
    const float* ml = part_ml + row_head * num_splits * 2;
    float m = NEG_INF;
    for (uint32_t s = 0; s < num_splits; ++s) m = fmaxf(m, ml[2 * s]);
    float l = 0.0f, acc = 0.0f;
    for (uint32_t s = 0; s < num_splits; ++s) {
        if (ml[2 * s] == NEG_INF) continue;
        const float w = exp2f(ml[2 * s] - m);
        l += ml[2 * s + 1] * w;
        acc += part_acc[(row_head * num_splits + s) * head_dim + threadIdx.x] * w;
    }
    out[row_head * head_dim + threadIdx.x] = l > 0.0f ? acc / l : 0.0f;
}

extern "C" __global__ void radix_attention_combine(const float* part_acc, const float* part_ml, float* out,
                                                   uint32_t num_splits, uint32_t head_dim) {
    attention_combine(part_acc, part_ml, out, num_splits, head_dim);
}

#define WRITE_KV(NAME, T)                                                                                  \
    extern "C" __global__ void NAME(const float* rows, const uint32_t* slots, T* cache, uint32_t n_rows, \
                                    uint32_t slot_len) {                                                  \
        write_kv<T>(rows, slots, cache, n_rows, slot_len);                                                \
    }

WRITE_KV(radix_write_kv_f32, float)
WRITE_KV(radix_write_kv_f16, __half)
WRITE_KV(radix_write_kv_bf16, __nv_bfloat16)

#define WRITE_KV_BLOCKS(NAME, B)                                                                          \
    extern "C" __global__ void NAME(const float* rows, const uint32_t* slots, uint8_t* cache, uint32_t n_rows, \
                                    uint32_t slot_len, uint32_t block, float norm) {                       \
        write_kv_blocks<B>(rows, slots, cache, n_rows, slot_len, block, norm);                             \
    }

WRITE_KV_BLOCKS(radix_write_kv_q8_0, BlockQ8_0)
WRITE_KV_BLOCKS(radix_write_kv_q4_0, BlockQ4_0)

extern "C" __global__ void radix_hadamard_heads(const float* src, float* dst, uint32_t head_dim, uint32_t block,
                                                float norm) {
    hadamard_heads(src, dst, head_dim, block, norm);
}

#define ATTENTION(NAME, KT, VT, D)                                                                               \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                     \
        NAME(const float* q, const KvFormat<KT>::Unit* k_cache, const KvFormat<VT>::Unit* v_cache,                \
             const uint32_t* seqs, const uint32_t* page_tables, const uint32_t* tiles, float* out,                \
             float* part_acc, float* part_ml, uint32_t num_heads, uint32_t num_kv_heads, uint32_t page_size,      \
             uint32_t partition, uint32_t num_splits, float scale_log2) {                                         \
        attention<KT, VT, D>(q, k_cache, v_cache, seqs, page_tables, tiles, out, part_acc, part_ml, num_heads,    \
                             num_kv_heads, page_size, partition, num_splits, scale_log2);                        \
    }

// Kernel names: radix_attention_<K format>_<V format>_d<head_dim>.
#define ATTENTION_BLOCK_DIMS(KT, VT, SUFFIX)              \
    ATTENTION(radix_attention_##SUFFIX##_d32, KT, VT, 32)   \
    ATTENTION(radix_attention_##SUFFIX##_d64, KT, VT, 64)   \
    ATTENTION(radix_attention_##SUFFIX##_d96, KT, VT, 96)   \
    ATTENTION(radix_attention_##SUFFIX##_d128, KT, VT, 128)

#define ATTENTION_ALL_DIMS(T, SUFFIX)                  \
    ATTENTION(radix_attention_##SUFFIX##_d16, T, T, 16) \
    ATTENTION_BLOCK_DIMS(T, T, SUFFIX)

ATTENTION_ALL_DIMS(float, f32_f32)
ATTENTION_ALL_DIMS(__half, f16_f16)
ATTENTION_ALL_DIMS(__nv_bfloat16, bf16_bf16)
// f16, q8_0 and q4_0 pair freely (models/src/kv_pool.rs, KvTypes::check); blocks need heads of
// whole blocks, so no d16.
ATTENTION_BLOCK_DIMS(__half, BlockQ8_0, f16_q8_0)
ATTENTION_BLOCK_DIMS(__half, BlockQ4_0, f16_q4_0)
ATTENTION_BLOCK_DIMS(BlockQ8_0, __half, q8_0_f16)
ATTENTION_BLOCK_DIMS(BlockQ8_0, BlockQ8_0, q8_0_q8_0)
ATTENTION_BLOCK_DIMS(BlockQ8_0, BlockQ4_0, q8_0_q4_0)
ATTENTION_BLOCK_DIMS(BlockQ4_0, __half, q4_0_f16)
ATTENTION_BLOCK_DIMS(BlockQ4_0, BlockQ8_0, q4_0_q8_0)
ATTENTION_BLOCK_DIMS(BlockQ4_0, BlockQ4_0, q4_0_q4_0)
