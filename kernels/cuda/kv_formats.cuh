// The K/V page formats the paged attention kernels read and write, and the Hadamard rotation the
// block formats are stored in (kernels/src/kv_quant.rs, kernels/src/hadamard.rs).
//
// `KvFormat<T>` says how one format is stored and converted: `Unit` is what the cache pointer
// points to, `load` converts CHUNK consecutive values of one head (starting at a multiple of
// CHUNK) to f32. The block formats are GGUF's q8_0 and q4_0 (34- and 18-byte blocks of 32 values,
// an f16 scale first, little-endian), held as bytes.
//
// Writing a block format rounds exactly as the CPU path does (ggml's reference quantizer): IEEE
// division and no fused multiply-add, which --use_fast_math would otherwise give, so a page written
// on the GPU holds the bytes the CPU would write for the same rows.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define KV_BLOCK 32

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
// Round to nearest even, as the CPU path (the `half` crate) does.
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Tags for the block formats.
struct BlockQ8_0 {};
struct BlockQ4_0 {};

// f32, f16 and bf16: 16 bytes per load.
template <typename T> struct KvFormat {
    using Unit = T;
    static constexpr int CHUNK = 16 / sizeof(T);
    __device__ __forceinline__ static void load(const T* __restrict__ cache, size_t value, float* out) {
        const uint4 raw = *reinterpret_cast<const uint4*>(cache + value);
        const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int e = 0; e < CHUNK; ++e) out[e] = to_f32(v[e]);
    }
};

// The scale of a block at `block` (2-byte aligned: every block size is even).
__device__ __forceinline__ float block_scale(const uint16_t* block) { return __half2float(__ushort_as_half(block[0])); }

// Rust's `x.round() as i8`: half away from zero, saturating, NaN to 0.
__device__ __forceinline__ int8_t round_i8(float x) {
    return x == x ? (int8_t)max(-128, min(127, (int)fmaxf(-128.0f, fminf(127.0f, roundf(x))))) : 0;
}

template <> struct KvFormat<BlockQ8_0> {
    using Unit = uint8_t;
    static constexpr int CHUNK = KV_BLOCK;
    static constexpr int BYTES = 2 + KV_BLOCK;
    __device__ __forceinline__ static void load(const uint8_t* __restrict__ cache, size_t value, float* out) {
        const uint16_t* b = reinterpret_cast<const uint16_t*>(cache + value / KV_BLOCK * BYTES);
        const float d = block_scale(b);
#pragma unroll
        for (int i = 0; i < KV_BLOCK / 2; ++i) {
            const uint16_t w = b[1 + i];
            out[2 * i] = (float)(int8_t)(w & 0xff) * d;
            out[2 * i + 1] = (float)(int8_t)(w >> 8) * d;
        }
    }
    // ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d) half away from zero.
    __device__ __forceinline__ static void store(const float* x, uint8_t* __restrict__ dst) {
        float amax = 0.0f;
        for (int j = 0; j < KV_BLOCK; ++j) amax = fmaxf(amax, fabsf(x[j]));
        const float d = __fdiv_rn(amax, 127.0f);
        const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        uint16_t* b = reinterpret_cast<uint16_t*>(dst);
        b[0] = __half_as_ushort(__float2half_rn(d));
        for (int i = 0; i < KV_BLOCK / 2; ++i) {
            const uint32_t lo = (uint8_t)round_i8(__fmul_rn(x[2 * i], id));
            const uint32_t hi = (uint8_t)round_i8(__fmul_rn(x[2 * i + 1], id));
            b[1 + i] = (uint16_t)(lo | (hi << 8));
        }
    }
};

template <> struct KvFormat<BlockQ4_0> {
    using Unit = uint8_t;
    static constexpr int CHUNK = KV_BLOCK;
    static constexpr int BYTES = 2 + KV_BLOCK / 2;
    // Byte j holds value j in its low nibble and value j + 16 in its high one.
    __device__ __forceinline__ static void load(const uint8_t* __restrict__ cache, size_t value, float* out) {
        const uint16_t* b = reinterpret_cast<const uint16_t*>(cache + value / KV_BLOCK * BYTES);
        const float d = block_scale(b);
#pragma unroll
        for (int i = 0; i < KV_BLOCK / 4; ++i) {
            const uint16_t w = b[1 + i];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t q = (w >> (8 * h)) & 0xff;
                out[2 * i + h] = (float)((int)(q & 0x0f) - 8) * d;
                out[2 * i + h + KV_BLOCK / 2] = (float)((int)(q >> 4) - 8) * d;
            }
        }
    }
    // ggml's quantize_row_q4_0_ref: d = (the value of largest magnitude, the first on a tie) / -8,
    // q = min(15, trunc(x / d + 8.5)).
    __device__ __forceinline__ static void store(const float* x, uint8_t* __restrict__ dst) {
        float mx = 0.0f;
        for (int j = 0; j < KV_BLOCK; ++j)
            if (fabsf(x[j]) > fabsf(mx)) mx = x[j];
        const float d = __fdiv_rn(mx, -8.0f);
        const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        auto q = [&](float v) -> uint32_t {
            const float f = __fadd_rn(__fmul_rn(v, id), 8.5f);
            // Rust's `as i32` truncates and maps NaN to 0; values here are >= 0 otherwise.
            return (uint32_t)min(15, f == f ? (int)f : 0);
        };
        uint16_t* b = reinterpret_cast<uint16_t*>(dst);
        b[0] = __half_as_ushort(__float2half_rn(d));
        for (int i = 0; i < KV_BLOCK / 4; ++i) {
            const uint32_t lo = q(x[2 * i]) | (q(x[2 * i + KV_BLOCK / 2]) << 4);
            const uint32_t hi = q(x[2 * i + 1]) | (q(x[2 * i + 1 + KV_BLOCK / 2]) << 4);
            b[1 + i] = (uint16_t)(lo | (hi << 8));
        }
    }
};

// The normalized Walsh-Hadamard transform of `len` floats in shared memory, over blocks of
// `block` values (a power of two dividing len), called by the whole thread block. The
// butterflies are hadamard.rs's, stage by stage, so every value is the CPU's bit for bit; `norm`
// is 1 / sqrt(block) as the host rounds it.
__device__ __forceinline__ void hadamard_shared(float* x, uint32_t len, uint32_t block, float norm) {
    __syncthreads();
    if (block <= 1) return;
    for (uint32_t half = 1; half < block; half <<= 1) {
        for (uint32_t p = threadIdx.x; p < len / 2; p += blockDim.x) {
            const uint32_t a = p / half * (2 * half) + p % half;
            const float u = x[a], v = x[a + half];
            x[a] = u + v;
            x[a + half] = u - v;
        }
        __syncthreads();
    }
    for (uint32_t i = threadIdx.x; i < len; i += blockDim.x) x[i] = __fmul_rn(x[i], norm);
    __syncthreads();
}
