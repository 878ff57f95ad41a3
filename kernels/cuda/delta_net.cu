// Gated DeltaNet (Qwen3.5's recurrent layers) on NVIDIA GPUs, over radix-serve's state pool in
// GPU memory. The algorithm is the CPU kernel's (kernels/src/delta_net.rs) in the per-token
// (recurrent) form for prefill and decode alike; the order of every sum is written down in
// kernels/src/delta_net/device_order.rs, a Rust model of these kernels that the CPU tests hold
// to the CPU kernel, so a device check only compares the device against that model.
//
// A pass packs the new tokens of several sequences; `seqs` has 4 words per sequence: its first
// row, its rows, its state slot and whether it starts from a zero state (a chunk starting at
// position 0). The state is read and written in place in the pool:
//   conv state  [slots, kernel - 1, channels]  the last inputs, oldest first
//   SSM state   [slots, value heads, key_dim, value_dim]
// Rows are f32: `qkv` [rows, channels] with channels = q (key heads x key_dim), k (same), v
// (value heads x value_dim); `a` and `b` [rows, value heads] (the raw projections).

#include <stdint.h>

// Value columns one block owns and threads sharing one column's key rows (a column's dot
// products reduce over SPLIT lanes of one warp: lane = column_in_warp + 8 * part).
#define COLS 32
#define SPLIT 4
#define THREADS (COLS * SPLIT)

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// ln(1 + e^x), linear above 20 as torch's softplus.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The xor butterfly over 32 lanes: every lane ends with the same sum.
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Depthwise causal convolution then SiLU. One thread per (channel, sequence), walking the
// sequence's rows with the window of the last KERNEL inputs in registers; the state ends with
// the sequence's last KERNEL - 1 inputs.
template <int KERNEL>
__device__ void conv(const float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ state,
                     float* __restrict__ out, const uint32_t* __restrict__ seqs, uint32_t channels) {
    constexpr int H = KERNEL - 1;
    const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x, seq = blockIdx.y;
    if (c >= channels) return;
    const uint32_t first = seqs[4 * seq], rows = seqs[4 * seq + 1], slot = seqs[4 * seq + 2];
    const bool fresh = seqs[4 * seq + 3] != 0;
    float* st = state + (size_t)slot * H * channels + c;
    float w[KERNEL], win[H];
#pragma unroll
    for (int tap = 0; tap < KERNEL; ++tap) w[tap] = weight[(size_t)c * KERNEL + tap];
#pragma unroll
    for (int h = 0; h < H; ++h) win[h] = fresh ? 0.0f : st[(size_t)h * channels];
    for (uint32_t t = 0; t < rows; ++t) {
        const size_t at = (size_t)(first + t) * channels + c;
        const float xt = x[at];
        float acc = 0.0f;
#pragma unroll
        for (int tap = 0; tap < H; ++tap) acc = fmaf(w[tap], win[tap], acc);
        acc = fmaf(w[H], xt, acc);
#pragma unroll
        for (int h = 0; h + 1 < H; ++h) win[h] = win[h + 1];
        win[H - 1] = xt;
        out[at] = silu(acc);
    }
#pragma unroll
    for (int h = 0; h < H; ++h) st[(size_t)h * channels] = win[h];
}

#define CONV(K)                                                                                              \
    extern "C" __global__ void radix_gdn_conv_k##K(const float* x, const float* weight, float* state, float* out, \
                                                    const uint32_t* seqs, uint32_t channels) {                    \
        conv<K>(x, weight, state, out, seqs, channels);                                                          \
    }

CONV(2)
CONV(3)
CONV(4)
CONV(5)
CONV(6)

// The gated delta rule, token after token, for one (value head, block of COLS value columns,
// sequence) per block. Thread (column j, part p) keeps rows i = p, p + SPLIT, ... (i < KMAX) of
// column j of the head's state in registers; per token, with q and k of the head's key head
// L2-normalised (q also by 1/sqrt(key_dim)), decay = exp(-exp(A_log) softplus(a + dt_bias)) and
// beta = sigmoid(b):
//   delta_j = (v_j - decay * sum_i k_i S_ij) * beta
//   S_ij    = decay * S_ij + k_i delta_j
//   out_j   = sum_i q_i S_ij
// Each sum runs over the thread's rows in order, then over the SPLIT parts as a butterfly.
template <int KMAX>
__device__ void rule(const float* __restrict__ qkv, const float* __restrict__ a, const float* __restrict__ b,
                     const float* __restrict__ neg_decay_rate, const float* __restrict__ dt_bias,
                     float* __restrict__ state, float* __restrict__ out, const uint32_t* __restrict__ seqs,
                     uint32_t num_key_heads, uint32_t num_value_heads, uint32_t key_dim, uint32_t value_dim,
                     uint32_t tiled) {
    constexpr int R = KMAX / SPLIT;
    __shared__ float q_s[KMAX], k_s[KMAX], gate_s[4];
    const uint32_t h = blockIdx.x, seq = blockIdx.z;
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t part = lane / 8;
    const uint32_t col = blockIdx.y * COLS + warp * 8 + lane % 8;
    const bool owns = col < value_dim;
    const uint32_t first = seqs[4 * seq], rows = seqs[4 * seq + 1], slot = seqs[4 * seq + 2];
    const bool fresh = seqs[4 * seq + 3] != 0;
    const uint32_t kh = tiled ? h % num_key_heads : h / (num_value_heads / num_key_heads);
    const uint32_t channels = 2 * num_key_heads * key_dim + num_value_heads * value_dim;
    float* s_head = state + ((size_t)slot * num_value_heads + h) * key_dim * value_dim;
    const float q_scale = 1.0f / sqrtf((float)key_dim);

    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const uint32_t i = part + SPLIT * r;
        s[r] = (owns && i < key_dim && !fresh) ? s_head[(size_t)i * value_dim + col] : 0.0f;
    }
    for (uint32_t i = threadIdx.x; i < KMAX; i += THREADS) {
        q_s[i] = 0.0f;
        k_s[i] = 0.0f;
    }
    for (uint32_t t = 0; t < rows; ++t) {
        const size_t row = first + t;
        const float* q_row = qkv + row * channels + kh * key_dim;
        const float* k_row = q_row + num_key_heads * key_dim;
        for (uint32_t i = threadIdx.x; i < key_dim; i += THREADS) {
            q_s[i] = q_row[i];
            k_s[i] = k_row[i];
        }
        __syncthreads();
        // Warp 0 normalises q, warp 1 k (each lane sums rows lane, lane + 32, ..., then the
        // butterfly); warp 2 makes the gates.
        if (warp < 2) {
            const float* v = warp == 0 ? q_s : k_s;
            float sq = 0.0f;
            for (uint32_t i = lane; i < key_dim; i += 32) sq = fmaf(v[i], v[i], sq);
            sq = warp_sum(sq);
            if (lane == 0) gate_s[warp] = (warp == 0 ? q_scale : 1.0f) / sqrtf(sq + 1e-6f);
        } else if (warp == 2 && lane == 0) {
            const float g = neg_decay_rate[h] * softplus(a[row * num_value_heads + h] + dt_bias[h]);
            gate_s[2] = expf(g);
            gate_s[3] = 1.0f / (1.0f + expf(-b[row * num_value_heads + h]));
        }
        __syncthreads();
        const float fq = gate_s[0], fk = gate_s[1], decay = gate_s[2], beta = gate_s[3];
        float kv = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) kv = fmaf(k_s[part + SPLIT * r] * fk, s[r], kv);
        kv += __shfl_xor_sync(0xffffffffu, kv, 8);
        kv += __shfl_xor_sync(0xffffffffu, kv, 16);
        const float v = owns ? qkv[row * channels + 2 * num_key_heads * key_dim + h * value_dim + col] : 0.0f;
        const float delta = (v - decay * kv) * beta;
        float o = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint32_t i = part + SPLIT * r;
            s[r] = fmaf(k_s[i] * fk, delta, decay * s[r]);
            o = fmaf(q_s[i] * fq, s[r], o);
        }
        o += __shfl_xor_sync(0xffffffffu, o, 8);
        o += __shfl_xor_sync(0xffffffffu, o, 16);
        if (owns && part == 0) out[(row * num_value_heads + h) * value_dim + col] = o;
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const uint32_t i = part + SPLIT * r;
        if (owns && i < key_dim) s_head[(size_t)i * value_dim + col] = s[r];
    }
}

#define RULE(KMAX)                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
        radix_gdn_rule_k##KMAX(const float* qkv, const float* a, const float* b, const float* neg_decay_rate,    \
                               const float* dt_bias, float* state, float* out, const uint32_t* seqs,             \
                               uint32_t num_key_heads, uint32_t num_value_heads, uint32_t key_dim,               \
                               uint32_t value_dim, uint32_t tiled) {                                             \
        rule<KMAX>(qkv, a, b, neg_decay_rate, dt_bias, state, out, seqs, num_key_heads, num_value_heads, key_dim, \
                   value_dim, tiled);                                                                            \
    }

RULE(32)
RULE(64)
RULE(128)
RULE(256)
