// Mixture-of-experts routing and dense expert dispatch on NVIDIA GPUs, so that a MoE layer
// never reads its router's probabilities back to the host. The order of every sum and the
// tie-breaking of the top-k are written down in kernels/src/moe.rs, a Rust model of these
// kernels that the CPU tests hold to the CPU path's routing.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// Experts one lane holds: up to 32 x MAX_PER_LANE experts.
#define MAX_PER_LANE 16
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Softmax over each row's `experts` logits, then its top `k` (the larger probability first;
// equal probabilities: the lower expert first, as torch.topk and the CPU path), renormalised to
// sum to 1 when `renormalize`. One warp per row; lane l holds experts l, l + 32, ...
// ids and weights are [rows, k].
extern "C" __global__ void radix_moe_topk(const float* __restrict__ logits, uint32_t rows, uint32_t experts,
                                          uint32_t k, uint32_t renormalize, uint32_t* __restrict__ ids,
                                          float* __restrict__ weights) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;  // the whole warp leaves together
    const float* x = logits + (size_t)row * experts;
    float p[MAX_PER_LANE];
    float m = NEG_INF;
#pragma unroll
    for (int j = 0; j < MAX_PER_LANE; ++j) {
        const uint32_t e = lane + 32 * j;
        p[j] = e < experts ? x[e] : NEG_INF;
        m = fmaxf(m, p[j]);
    }
    m = warp_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < MAX_PER_LANE; ++j) {
        const uint32_t e = lane + 32 * j;
        p[j] = e < experts ? expf(p[j] - m) : 0.0f;
        sum += p[j];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < MAX_PER_LANE; ++j) p[j] = p[j] / sum;
    // k rounds of a warp-wide argmax; a chosen expert drops out (-1 is below every probability).
    bool taken[MAX_PER_LANE];
#pragma unroll
    for (int j = 0; j < MAX_PER_LANE; ++j) taken[j] = lane + 32 * j >= experts;
    float total = 0.0f;
    for (uint32_t r = 0; r < k; ++r) {
        float best = -1.0f;
        uint32_t best_e = 0xffffffffu;
#pragma unroll
        for (int j = 0; j < MAX_PER_LANE; ++j) {
            // Within a lane experts rise with j, so `>` keeps the lower of two equal ones.
            if (!taken[j] && p[j] > best) {
                best = p[j];
                best_e = lane + 32 * j;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, best, o);
            const uint32_t other_e = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (other > best || (other == best && other_e < best_e)) {
                best = other;
                best_e = other_e;
            }
        }
        if (best_e % 32 == lane) taken[best_e / 32] = true;
        if (lane == 0) {
            ids[(size_t)row * k + r] = best_e;
            weights[(size_t)row * k + r] = best;
        }
        total += best;
    }
    if (renormalize && lane == 0) {
        for (uint32_t r = 0; r < k; ++r) weights[(size_t)row * k + r] /= total;
    }
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// out[row, j, o] = W[ids[row, j]][o] . x[row, j or 0]: each routed (row, expert) pair's matrix
// row times its input, for experts stored densely as [experts, n, k] (an id past the experts,
// which the routing never makes, gives 0 rather than a read out of bounds). One warp per output value;
// lane l sums inputs l, l + 32, ..., then the butterfly. `x_per_row` is 1 when every expert of a
// row reads the same input (gate and up), `topk` when each reads its own (down).
template <typename T>
__device__ void dense_indexed(const T* __restrict__ w, const float* __restrict__ x, const uint32_t* __restrict__ ids,
                              float* __restrict__ out, uint32_t experts, uint32_t n, uint32_t k, uint32_t topk,
                              uint32_t x_per_row) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t o = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const uint32_t row = blockIdx.y, j = blockIdx.z;
    if (o >= n) return;
    const uint32_t e = ids[(size_t)row * topk + j];
    if (e >= experts) {
        if (lane == 0) out[((size_t)row * topk + j) * n + o] = 0.0f;
        return;
    }
    const T* wr = w + ((size_t)e * n + o) * k;
    const float* xr = x + ((size_t)row * x_per_row + (x_per_row == 1 ? 0 : j)) * k;
    float acc = 0.0f;
    for (uint32_t c = lane; c < k; c += 32) acc = fmaf(to_f32(wr[c]), xr[c], acc);
    acc = warp_sum(acc);
    if (lane == 0) out[((size_t)row * topk + j) * n + o] = acc;
}

#define DENSE(NAME, T)                                                                                   \
    extern "C" __global__ void NAME(const T* w, const float* x, const uint32_t* ids, float* out,          \
                                    uint32_t experts, uint32_t n, uint32_t k, uint32_t topk,              \
                                    uint32_t x_per_row) {                                                 \
        dense_indexed<T>(w, x, ids, out, experts, n, k, topk, x_per_row);                                 \
    }

DENSE(radix_moe_dense_f32, float)
DENSE(radix_moe_dense_f16, __half)
DENSE(radix_moe_dense_bf16, __nv_bfloat16)

// out[row, :] = sum over j of weights[row, j] * y[row, j, :], j in rank order (the same sums
// whatever else the batch holds). One thread per (row, column).
extern "C" __global__ void radix_moe_combine(const float* __restrict__ y, const float* __restrict__ weights,
                                             float* __restrict__ out, uint32_t rows, uint32_t topk,
                                             uint32_t hidden) {
    const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y;
    if (c >= hidden || row >= rows) return;
    float acc = 0.0f;
    for (uint32_t j = 0; j < topk; ++j)
        acc = fmaf(weights[(size_t)row * topk + j], y[((size_t)row * topk + j) * hidden + c], acc);
    out[(size_t)row * hidden + c] = acc;
}
