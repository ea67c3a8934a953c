// common.cuh: NVFP4 decoding, the order-preserving score key, warp and block helpers.
//
// NVRTC-only: no host or library headers. Included by every kernel source; the
// loader in indexer/_jit.py inlines it, so CuPy's cache key covers this file too.
#pragma once

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

// ---------------------------------------------------------------------------
// NVFP4 element and scale decoding
// ---------------------------------------------------------------------------

// float value of a 4-bit E2M1 code: bit 3 sign, bits 0-2 -> 0, .5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1_to_float(u32 code) {
    const u32 m = code & 7u;
    // m >= 2: exponent (m >> 1) - 1, mantissa bit m & 1; m = 1 is the subnormal 0.5.
    u32 bits = (m >= 2u) ? ((((m >> 1) + 126u) << 23) | ((m & 1u) << 22)) : (m ? 0x3f000000u : 0u);
    bits |= (code & 8u) << 28;
    return __int_as_float((int)bits);
}

// float value of a float8_e4m3fn byte: bias 7, no Inf, 0x7F / 0xFF are NaN.
__device__ __forceinline__ float e4m3_to_float(u32 b) {
    const u32 e = (b >> 3) & 15u, m = b & 7u;
    float mag;
    if ((b & 0x7fu) == 0x7fu) {
        mag = __int_as_float(0x7fc00000);
    } else if (e == 0u) {
        mag = (float)m * 0.001953125f;  // m * 2^-9, exact
    } else {
        mag = __int_as_float((int)(((e + 120u) << 23) | (m << 20)));
    }
    return (b & 0x80u) ? -mag : mag;
}

// ---------------------------------------------------------------------------
// Score keys: an unsigned integer whose order is the order of the float score.
// NaN maps to 0, below every real score (-inf maps to 0x007fffff), and is never selected.
// -0.0 is folded into +0.0 first: they are equal scores and must tie by index.
// ---------------------------------------------------------------------------
__device__ __forceinline__ u32 score_to_key(float x) {
    if (x != x) return 0u;
    const u32 u = (u32)__float_as_int(x + 0.0f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_to_score(u32 key) {
    const u32 u = (key & 0x80000000u) ? (key ^ 0x80000000u) : ~key;
    return __int_as_float((int)u);
}

// ReLU that keeps NaN (fmaxf would turn NaN into 0 and select a broken entry).
__device__ __forceinline__ float relu_keep_nan(float x) { return x < 0.0f ? 0.0f : x; }

// ---------------------------------------------------------------------------
// Block-wide exclusive scan of one u32 per thread; all threads must call it.
// `scratch` holds at least 32 u32 in shared memory. Returns the exclusive prefix,
// and the block total in *total.
// ---------------------------------------------------------------------------
template <int kThreads>
__device__ __forceinline__ u32 block_exclusive_scan(u32 v, u32* scratch, u32* total) {
    static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
    constexpr int kWarps = kThreads / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 incl = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const u32 y = __shfl_up_sync(FULL_MASK, incl, off);
        if (lane >= off) incl += y;
    }
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        u32 s = lane < kWarps ? scratch[lane] : 0u;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const u32 y = __shfl_up_sync(FULL_MASK, s, off);
            if (lane >= off) s += y;
        }
        scratch[lane] = s;  // inclusive prefix of warp totals
    }
    __syncthreads();
    const u32 warp_base = warp ? scratch[warp - 1] : 0u;
    *total = scratch[kWarps - 1];
    __syncthreads();  // scratch may be reused right after
    return warp_base + incl - v;
}

// ---------------------------------------------------------------------------
// Block-wide bitonic sort of `size` (a power of two, >= 64) u64 in shared memory, descending.
// All threads must call it; it ends with a barrier.
//
// Each compare-exchange stage (merge size k, distance j) pairs i with i | j. Stages with
// j <= the pairs of one warp's contiguous segment stay inside that segment, so they need
// only __syncwarp; block barriers are left for the few stages with larger distances (21 of
// 78 for 4,096 keys).
// ---------------------------------------------------------------------------
__device__ __forceinline__ void bitonic_exchange(u64* a, u32 q, u32 j, u32 k) {
    const u32 i = ((q & ~(j - 1u)) << 1) | (q & (j - 1u)), p = i | j;
    const u64 x = a[i], y = a[p];
    if (((i & k) == 0u) ? (x < y) : (x > y)) {  // descending in blocks with bit k clear
        a[i] = y;
        a[p] = x;
    }
}

template <int kThreads>
__device__ __forceinline__ void bitonic_sort_desc(u64* a, u32 size) {
    static_assert(kThreads % 32 == 0, "whole warps");
    const u32 pairs = size >> 1, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 per_thread = pairs > (u32)kThreads ? pairs / kThreads : 1u;
    const u32 seg = 32u * per_thread;       // pairs of one warp's segment (2 * seg keys)
    const bool active = warp * seg < pairs;  // with few keys, some warps sit out
    const u32 q0 = warp * seg + lane;
    // merges up to 2 * seg keys: entirely inside each warp's segment
    if (active) {
        for (u32 k = 2u; k <= 2u * seg && k <= size; k <<= 1) {
            for (u32 j = k >> 1; j > 0u; j >>= 1) {
                for (u32 m = 0; m < per_thread; ++m) bitonic_exchange(a, q0 + 32u * m, j, k);
                __syncwarp();
            }
        }
    }
    __syncthreads();
    for (u32 k = 4u * seg; k <= size; k <<= 1) {
        u32 j = k >> 1;
        for (; j > seg; j >>= 1) {  // across segments: the whole block
            for (u32 q = threadIdx.x; q < pairs; q += kThreads) bitonic_exchange(a, q, j, k);
            __syncthreads();
        }
        if (active) {
            for (; j > 0u; j >>= 1) {
                for (u32 m = 0; m < per_thread; ++m) bitonic_exchange(a, q0 + 32u * m, j, k);
                __syncwarp();
            }
        }
        __syncthreads();
    }
}

// Candidate encoding shared by the selects: (key << 32) | ~index, so that a descending sort
// orders by score descending, then index ascending.
__device__ __forceinline__ u64 make_candidate(u32 key, int index) { return ((u64)key << 32) | (u64)(~(u32)index); }
__device__ __forceinline__ int candidate_index(u64 c) { return (int)(~(u32)(c & 0xffffffffull)); }
__device__ __forceinline__ u32 candidate_key(u64 c) { return (u32)(c >> 32); }

// Write output slot i of a row: the candidate's index (logical, or physical through the
// row's block table) and score; -1 and -inf when i is past the m winners.
__device__ __forceinline__ void write_winner(int i, u32 m, const u64* cand, const int* __restrict__ bt_row, int E,
                                             int num_blocks, int physical, int* __restrict__ out_idx,
                                             float* __restrict__ out_scores) {
    int idx = -1;
    float sc = -__int_as_float(0x7f800000);
    if ((u32)i < m) {
        const u64 c = cand[i];
        const int s = candidate_index(c);
        sc = key_to_score(candidate_key(c));
        idx = s;
        if (physical) {
            const int b = bt_row[s / E];
            idx = (b >= 0 && b < num_blocks) ? b * E + s % E : -1;
        }
    }
    out_idx[i] = idx;
    if (out_scores) out_scores[i] = sc;
}
