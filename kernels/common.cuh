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
// Programmatic dependent launch (sm_90+; indexer/launch.py). A kernel launched with it is
// placed while the kernel before it on the stream is still ending: its CTAs start as soon
// as every CTA of the previous grid has exited or called let_next_grid_start, without
// waiting for the grid's end to be signalled and a new launch to be processed. Every CTA of
// such a kernel waits here until the previous grid has finished and its writes are
// visible, before it touches anything that grid writes, and before any exit (a grid
// whose CTAs all left without waiting could end before its predecessor): the select
// kernels at their start (the row select under the dense kernel at its end instead, having
// read its row once the row's count said it was stored: row_ready below), the
// single-query wgmma scoring kernel once it has scheduled its tiles and started its key
// copies (before its query image's copy), the pair wgmma scoring kernel's issuing warp
// before its query images' copies (its other warps read prep's images only through them;
// every thread of both waits again before it exits), the dense scoring kernel once it has
// built its schedule
// (before any copy of the key image, which the kernel before it writes). Before the wait a
// CTA may read only what no kernel of the call writes: the histogram and filter kernels load
// their row's length (valid_lens, an input) first. Whatever wrote it ran before the call's
// first launch, an ordinary one that started after it ended, and each later kernel of the
// call starts after the one before it has started. A no-op for ordinary launches and before
// sm_90.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel after this one (launched with programmatic dependent launch) be placed
// once every CTA of this grid has called it or exited: the first call in a CTA counts. The
// warp-specialised scoring kernel calls it at a CTA's last tile, before its histogram
// flush, so that the filter's placement overlaps the slowest CTAs' flushes, not the scoring
// itself (a trigger at the start of the scoring and filter kernels made batch 1 slower: the
// next grid's CTAs waited on SMs the running grid was using, docs/performance.md v26);
// prep_query_kernel, short, calls it at its start (v28); the filter once its count's atomic
// is done, so that the rank's (or final's) CTAs are placed while it appends its candidates
// (batch 1 -0.2..-0.3 us; once it knows its threshold, before its compares: +0.8..1.1 us, v42);
// dense_keys_kernel (32 CTAs for prefill-8K) at its start, so that the dense kernel builds its
// schedule on the idle SMs (prefill-8K -2.8 us, v53), the dense kernel at its start (its
// registers leave no room for a select CTA on its SM: measured neutral, v53), and the
// balanced wgmma scoring kernels at each CTA's end (whole calls -0.2..-0.4%, v74; a next
// run's scoring kernel placed then claims from the other pair of counters: cuda_ops).
__device__ __forceinline__ void let_next_grid_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Rows handed from the dense scoring kernel to the row select while it still runs (the
// select's CTAs are placed on the SMs its CTAs leave, programmatic dependent launch): a
// count a row of the scores stored, which each scoring CTA adds to at its end, once its
// stores are done (a barrier, then a fence and a relaxed add a row: the release pattern),
// and which the select reads with acquire until it reaches the row's length, then clears
// (zero at rest, indexer/workspace.py).
__device__ __forceinline__ void red_relaxed_add(u32* p, u32 v) {
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 load_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Waits (thread 0 of the CTA; the caller's barrier then orders the other threads' reads)
// until *count reaches n, about 10 ms at most: past that (a row no scoring CTA writes, from
// inconsistent inputs run unvalidated) the wait for the whole previous grid takes over, so
// a bad row costs time, never a hang.
__device__ __forceinline__ void wait_for_count(const u32* count, u32 n) {
    for (int spin = 0; spin < (1 << 16); ++spin) {
        if (load_acquire(count) >= n) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        __nanosleep(128);
#endif
    }
    wait_for_previous_grid();
}

// The select's per-row candidate counts (the filter's append cursors) start each call at
// zero: the kernel before the filter (the scoring kernel; the histogram kernel on the exact
// path), which starts after the previous call's select has ended and ends before this
// call's filter starts, clears them in one CTA. The histograms are cleared by the select's
// last kernel instead (topk_rank_kernel / topk_final_kernel): see indexer/workspace.py.
__device__ __forceinline__ void clear_candidate_counts(u32* __restrict__ count, int rows) {
    if (count != nullptr && blockIdx.x == 0 && blockIdx.y == 0)
        for (int i = threadIdx.x; i < rows; i += blockDim.x) count[i] = 0u;
}

// ---------------------------------------------------------------------------
// L2 residency of the scores (sm_90+). A decode call writes its rows' scores once and the
// select reads them right after, while the keys stream through L2 once. The keys' copies
// are marked first to leave L2, so that a run's scores (up to ~34 MB in the decode cases)
// can still be there when the filter reads them, and a dirty line that the next call's
// scores overwrite in place need not go back to HBM.
__device__ __forceinline__ u64 l2_evict_first() {
    u64 p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}

// Asynchronous 4- and 16-byte copies into shared memory (cp.async, sm_80+), zero-filled
// where !valid (nothing read then); each thread's groups are committed and waited for by
// that thread.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* src, bool valid) {
    const u32 dst = (u32)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* src, bool valid) {
    const u32 dst = (u32)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

// ---------------------------------------------------------------------------
// The query's element type: a template argument (class QT, float by default) of every
// kernel that reads q, so that float16, bfloat16 and float8_e4m3fn queries are read where
// they lie (no cast kernel before the call). half_bits, bf16_bits and e4m3_bits are the bit
// patterns (NVRTC needs no fp16 or fp8 header for them); query_float widens any of them
// exactly to float, and query_float4 four consecutive values (16 bytes of float, 8 of the
// 16-bit types, 4 of e4m3: the caller's row is aligned to that).
// ---------------------------------------------------------------------------
// Whether `cvt.rn.f16x2.e4m3x2` assembles for this target: sm_90 from PTX ISA 7.8, sm_89 only
// from PTX ISA 8.1 (CUDA 12.1; NVRTC 12.0's ptxas refuses it on sm_89). Elsewhere the
// conversions take their logic-op forms.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900 || (__CUDA_ARCH__ >= 890 && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 1))))
#define INDEXER_CVT_E4M3X2 1
#else
#define INDEXER_CVT_E4M3X2 0
#endif

struct half_bits {
    unsigned short bits;
};
struct bf16_bits {
    unsigned short bits;
};
struct e4m3_bits {
    unsigned char bits;
};
__device__ __forceinline__ float e4m3_to_float(u32 b);  // below, with the key scales' decoding

__device__ __forceinline__ float query_float(float x) { return x; }
__device__ __forceinline__ float query_float(half_bits x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float query_float(bf16_bits x) { return __uint_as_float((u32)x.bits << 16); }

// the two 16-bit values of a 32-bit word (low half first) as floats
__device__ __forceinline__ float2 query_float2(u32 v, half_bits) {
    return make_float2(query_float(half_bits{(unsigned short)(v & 0xffffu)}),
                       query_float(half_bits{(unsigned short)(v >> 16)}));
}
__device__ __forceinline__ float2 query_float2(u32 v, bf16_bits) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// float8: through the hardware conversion to fp16 where there is one (every e4m3 value is
// an fp16 value), ~2 instructions a value where the logic form takes ~10 and branches
__device__ __forceinline__ float query_float(e4m3_bits x) {
#if INDEXER_CVT_E4M3X2
    u32 h;
    asm("{ .reg .b16 b; cvt.u16.u32 b, %1; cvt.rn.f16x2.e4m3x2 %0, b; }" : "=r"(h) : "r"((u32)x.bits));
    return query_float(half_bits{(unsigned short)(h & 0xffffu)});
#else
    return e4m3_to_float(x.bits);
#endif
}

// values 4i .. 4i + 3 of a row of queries, as floats
__device__ __forceinline__ float4 query_float4(const float* row, int i) { return reinterpret_cast<const float4*>(row)[i]; }
__device__ __forceinline__ float4 query_float4(const e4m3_bits* row, int i) {
    const u32 v = reinterpret_cast<const u32*>(row)[i];
#if INDEXER_CVT_E4M3X2
    u32 lo, hi;  // bytes 0, 1 and 2, 3 as fp16x2 (the low byte to the low half)
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.rn.f16x2.e4m3x2 %0, l; cvt.rn.f16x2.e4m3x2 %1, h; }"
        : "=r"(lo), "=r"(hi) : "r"(v));
    const float2 a = query_float2(lo, half_bits{}), b = query_float2(hi, half_bits{});
    return make_float4(a.x, a.y, b.x, b.y);
#else
    return make_float4(e4m3_to_float(v & 255u), e4m3_to_float((v >> 8) & 255u), e4m3_to_float((v >> 16) & 255u),
                       e4m3_to_float(v >> 24));
#endif
}
template <class QT>
__device__ __forceinline__ float4 query_float4(const QT* row, int i) {
    const uint2 v = reinterpret_cast<const uint2*>(row)[i];
    const float2 lo = query_float2(v.x, QT{}), hi = query_float2(v.y, QT{});
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

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

// score_to_key for a score known to be neither NaN nor -0 (two instructions: no compare,
// no fold)
__device__ __forceinline__ u32 key_bits_of_plus_zero(float x) {
    const u32 u = (u32)__float_as_int(x);
    return u ^ ((u32)((int)u >> 31) | 0x80000000u);
}

// A histogram bin by the score's raw bits (score neither NaN nor -0): their top 11 bits, one
// shift where its key's bin (key_bits_of_plus_zero(x) >> 21) takes three more ALU
// instructions. The map between the two is a permutation of the 2,048 bins (positive
// scores' bins move up by 1,024, negative ones' reverse), applied once a bin when a CTA's
// counts are flushed (key_bin_of_raw_bin).
__device__ __forceinline__ u32 raw_bin_of_plus_zero(float x) { return (u32)__float_as_int(x) >> 21; }
__device__ __forceinline__ u32 key_bin_of_raw_bin(u32 b) { return b ^ (b >= 1024u ? 0x7ffu : 0x400u); }

// score_to_key for a score known not to be NaN (one compare fewer than score_to_key)
__device__ __forceinline__ u32 score_to_key_not_nan(float x) { return key_bits_of_plus_zero(x + 0.0f); }  // -0 -> +0

// The least score whose key is >= t, as a bound to compare scores against: for every x,
// x >= score_bound_of_key(t) exactly where x is not NaN and score_to_key(x) >= t (the key
// order is the scores' order, -0 as +0). Keys up to -inf's (0x007fffff: NaN patterns and
// -inf) give -inf, so that t = 0 takes every non-NaN score; keys past +inf's give a NaN,
// which nothing is >= (the filter's and the streamed select's one compare an entry where a
// key takes several). Under flush-to-zero (CuPy compiles with -ftz=true) both sides compare
// as their flushed values, the values score_to_key keys: exact wherever the bound is not
// subnormal (every key score_to_key gives, such as a sampled threshold), and for a bin
// edge's positive subnormal bound the entries that flush to 0 pass too: a few more, keyed
// below the edge, never fewer.
__device__ __forceinline__ float score_bound_of_key(u32 t) {
    return t <= 0x007fffffu ? __int_as_float((int)0xff800000u) : key_to_score(t);
}

// Entries of row `row` that are scored: valid_lens[row] clamped to [0, max_len] (lengths
// are not trusted with validate=False).
__device__ __forceinline__ int visible_len(const int* __restrict__ valid_lens, int row, int max_len) {
    const int len = valid_lens[row];
    return len < 0 ? 0 : (len > max_len ? max_len : len);
}

// *p = v where pred holds, by one predicated store: no branch around it, so that a caller
// can make the address outside the hot path (ptxas sinks an address used only under a
// branch into it, and makes it again each time)
__device__ __forceinline__ void store_global_if(float* p, float v, bool pred) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q st.global.f32 [%0], %1;\n\t}" ::"l"(p), "f"(v),
                 "r"((int)pred));
}

// *p = v by a global store whatever ptxas knows of p (a pointer through a shuffle, as a
// warp-uniform row base is, would otherwise take a generic store)
__device__ __forceinline__ void store_global(float* p, float v) {
    asm volatile("st.global.f32 [%0], %1;" ::"l"(p), "f"(v));
}

// The same for a u64 in shared memory
__device__ __forceinline__ void store_shared_if(u64* p, u64 v, bool pred) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q st.shared.u64 [%0], %1;\n\t}" ::"r"(
                     (u32)__cvta_generic_to_shared(p)), "l"(v), "r"((int)pred) : "memory");
}

// ReLU that keeps NaN (fmaxf would turn NaN into 0 and select a broken entry).
__device__ __forceinline__ float relu_keep_nan(float x) { return x < 0.0f ? 0.0f : x; }

// The inclusive prefix sum of v over the lanes of a whole warp (lane 0 first); every lane
// of the warp calls it.
__device__ __forceinline__ u32 warp_inclusive_scan(u32 v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const u32 y = __shfl_up_sync(FULL_MASK, v, off);
        if (lane >= off) v += y;
    }
    return v;
}

// The first step of both block scans: v's inclusive scan within its warp (returned), each
// warp's total in scratch[warp], then a barrier.
__device__ __forceinline__ u32 warp_scan_publish_total(u32 v, u32* scratch) {
    const u32 incl = warp_inclusive_scan(v);
    if ((threadIdx.x & 31) == 31) scratch[threadIdx.x >> 5] = incl;
    __syncthreads();
    return incl;
}

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
    const u32 incl = warp_scan_publish_total(v, scratch);
    if (warp == 0) scratch[lane] = warp_inclusive_scan(lane < kWarps ? scratch[lane] : 0u);  // of the warp totals
    __syncthreads();
    const u32 warp_base = warp ? scratch[warp - 1] : 0u;
    *total = scratch[kWarps - 1];
    __syncthreads();  // scratch may be reused right after
    return warp_base + incl - v;
}

// The same scan with one barrier, for blocks of at most 8 warps: each thread sums the warp
// totals before its own instead of a warp scanning them (two barriers fewer). The caller
// must pass a barrier before `scratch` is written again.
template <int kThreads>
__device__ __forceinline__ u32 block_exclusive_scan_one_barrier(u32 v, u32* scratch, u32* total) {
    static_assert(kThreads % 32 == 0 && kThreads <= 256, "whole warps, at most 8");
    constexpr int kWarps = kThreads / 32;
    const int warp = threadIdx.x >> 5;
    const u32 incl = warp_scan_publish_total(v, scratch);
    u32 warp_base = 0u, sum = 0u;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        const u32 t = scratch[w];
        warp_base += w < warp ? t : 0u;
        sum += t;
    }
    *total = sum;
    return warp_base + incl - v;
}

// ---------------------------------------------------------------------------
// Block-wide bitonic sort of `size` u64 keys in shared memory, descending. `size` is a power
// of two, at least kSortMinSize (sort_size); all threads must call it (it has barriers); the
// caller fills a[0, size) and syncs first; it ends with a barrier.
//
// Thread t holds positions kPer*t .. kPer*t + kPer-1 in registers (only the first size/kPer
// threads: whole warps). A compare-exchange stage (merge size k, distance j) pairs position
// p with p ^ j: for j < kPer both are in one thread's registers, for j < 32*kPer in two
// lanes of one warp (a shuffle), and only the few stages with larger j go through shared
// memory (at 8 keys per thread, 6 of 66 stages for 2,048 keys), instead of every stage.
// ---------------------------------------------------------------------------
constexpr unsigned kSortMinSize = 256u;  // whole warps at 8 keys per thread

// sort size for m keys: the next power of two, at least kSortMinSize
__device__ __forceinline__ u32 sort_size(u32 m) {
    u32 size = kSortMinSize;
    while (size < m) size <<= 1;
    return size;
}

// Where the sort keeps position p in shared memory between its cross-warp stages: XOR of
// the low 4 bits with the next 4 permutes each aligned group of 16 keys, so that a warp's
// 32 lanes reading their slot i (positions kPer*lane + i) hit 16 different bank pairs
// instead of one or two (8-byte keys: 2 wavefronts instead of 16 or 32).
__device__ __forceinline__ u32 sort_slot(u32 p) { return p ^ ((p >> 4) & 15u); }

// the q-th pair (i, i | j) of a stage in shared memory, exchanged so that blocks of size k
// with bit k clear end descending, the others ascending
__device__ __forceinline__ void bitonic_exchange(u64* a, u32 q, u32 j, u32 k) {
    const u32 i = ((q & ~(j - 1u)) << 1) | (q & (j - 1u)), p = i | j;
    const u32 si = sort_slot(i), sp = sort_slot(p);
    const u64 x = a[si], y = a[sp];
    // keys are distinct but for zero padding (equal: swapping changes nothing), so one
    // comparison against the direction decides (two 32-bit compares, not four)
    if ((x < y) == ((i & k) == 0u)) {
        a[si] = y;
        a[sp] = x;
    }
}

// One merge (blocks of size k) of bitonic_sort_desc_regs: thread t's keys x are positions
// base = kPer*t ..; `active`: the thread holds keys (the same in a whole warp).
template <int kThreads, int kPer>
__device__ __forceinline__ void bitonic_regs_merge(u64* a, u64 (&x)[kPer], u32 k, u32 size, u32 base, u32 lane,
                                                   bool active) {
    constexpr u32 kWarpSpan = 32u * kPer;  // distances below this stay inside a warp
    const u32 t = threadIdx.x;
    u32 j = k >> 1;
    if (j >= kWarpSpan) {  // across warps: through shared memory, swizzled
        if (active) {
#pragma unroll
            for (int i = 0; i < kPer; ++i) a[sort_slot(base + i)] = x[i];
        }
        __syncthreads();
        for (; j >= kWarpSpan; j >>= 1) {
            for (u32 q = t; q < (size >> 1); q += kThreads) bitonic_exchange(a, q, j, k);
            __syncthreads();
        }
        if (active) {  // each thread reloads only its own slots: the next store needs no barrier
#pragma unroll
            for (int i = 0; i < kPer; ++i) x[i] = a[sort_slot(base + i)];
        }
    }
    if (!active) return;
    // across lanes: the partner holds the same slot i. Distances 16*kPer .. kPer, those
    // at most k/2 (unrolled: no loop counter, no register moves between stages)
#pragma unroll
    for (int mm = 16; mm >= 1; mm >>= 1) {
        if ((u32)mm * kPer > (k >> 1)) continue;  // the same in every thread
        const bool lower = (lane & (u32)mm) == 0u;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            const u64 y = __shfl_xor_sync(FULL_MASK, x[i], mm);
            const bool keep_larger = lower == (((base + i) & k) == 0u);
            // distinct keys but for zero padding (equal: either is the same bits)
            x[i] = (y > x[i]) == keep_larger ? y : x[i];
        }
    }
#pragma unroll
    for (int jj = kPer / 2; jj > 0; jj >>= 1) {  // inside a thread's registers
        if ((u32)jj > (k >> 1)) continue;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            if (i & jj) continue;
            const bool desc = ((base + i) & k) == 0u;
            const u64 lo = x[i], hi = x[i | jj];
            const bool swap = (lo < hi) == desc;  // equal keys: swapping changes nothing
            x[i] = swap ? hi : lo;
            x[i | jj] = swap ? lo : hi;
        }
    }
}

// kSize > 0: size == kSize, known at compile time, so that every merge and stage is
// unrolled with its distances folded (no per-stage tests and branches: the row select's
// sort of 512 winners spent a quarter of its samples on those branches).
template <int kThreads, int kPer, u32 kSize = 0>
__device__ __forceinline__ void bitonic_sort_desc_regs(u64* a, u32 size) {
    static_assert(kThreads % 32 == 0 && (kPer & (kPer - 1)) == 0 && kPer >= 2 && kPer <= 16,
                  "whole warps, kPer a power of two up to 16");
    static_assert((kSize & (kSize - 1)) == 0, "kSize: 0 or a power of two");
    if constexpr (kSize > 0) size = kSize;
    const u32 t = threadIdx.x, lane = t & 31u, base = (u32)kPer * t;
    const bool active = base < size;  // size is a multiple of 32 * kPer: whole warps
    u64 x[kPer];
    if (active) {  // natural order in: a[p]
#pragma unroll
        for (int i = 0; i < kPer; ++i) x[i] = a[base + i];
    }
    __syncthreads();  // the swizzled stores below overwrite other threads' natural slots
    if constexpr (kSize > 0) {
#pragma unroll
        for (u32 lk = 1; (1u << lk) <= kSize; ++lk) bitonic_regs_merge<kThreads, kPer>(a, x, 1u << lk, kSize, base, lane, active);
    } else {
        for (u32 k = 2u; k <= size; k <<= 1) bitonic_regs_merge<kThreads, kPer>(a, x, k, size, base, lane, active);
    }
    __syncthreads();  // every swizzled reload done before the natural stores
    if (active) {  // natural order out
#pragma unroll
        for (int i = 0; i < kPer; ++i) a[base + i] = x[i];
    }
    __syncthreads();
}

// a[p] <-> a[sort_slot(p)] for every p (sort_slot is its own inverse: natural <-> swizzled)
template <int kThreads>
__device__ __forceinline__ void swap_sort_slots(u64* a, u32 size) {
    for (u32 i = threadIdx.x; i < size; i += kThreads) {
        const u32 s = sort_slot(i);
        if (i < s) {
            const u64 x = a[i];
            a[i] = a[s];
            a[s] = x;
        }
    }
    __syncthreads();
}

// Sizes above kPer * kThreads (top-k beyond the register capacity): every stage in shared memory.
template <int kThreads>
__device__ __forceinline__ void bitonic_sort_desc_shared(u64* a, u32 size) {
    swap_sort_slots<kThreads>(a, size);  // natural -> swizzled
    for (u32 k = 2u; k <= size; k <<= 1) {
        for (u32 j = k >> 1; j > 0u; j >>= 1) {
            for (u32 q = threadIdx.x; q < (size >> 1); q += kThreads) bitonic_exchange(a, q, j, k);
            __syncthreads();
        }
    }
    swap_sort_slots<kThreads>(a, size);  // swizzled -> natural
}

// The sort: keys in registers, 2 per thread while that keeps every warp busy (4 for 512 keys
// at 128 threads), else 8; all in shared memory past 8 per thread (top-k beyond the registers).
template <int kThreads>
__device__ __forceinline__ void bitonic_sort_desc(u64* a, u32 size) {
    if (size == (u32)(2 * kThreads)) bitonic_sort_desc_regs<kThreads, 2, 2 * kThreads>(a, size);  // top-k 512 at 256 threads
    else if (kThreads == 128 && size == (u32)(4 * kThreads))  // top-k 512 at 128 threads: the short-row select
        bitonic_sort_desc_regs<kThreads, 4, 4 * kThreads>(a, size);
    else if (size <= (u32)(2 * kThreads)) bitonic_sort_desc_regs<kThreads, 2>(a, size);
    else if (size <= (u32)(8 * kThreads)) bitonic_sort_desc_regs<kThreads, 8>(a, size);
    else bitonic_sort_desc_shared<kThreads>(a, size);
}

// Candidate encoding shared by the selects: (key << 32) | ~index, so that a descending sort
// orders by score descending, then index ascending.
__device__ __forceinline__ u64 make_candidate(u32 key, int index) { return ((u64)key << 32) | (u64)(~(u32)index); }
__device__ __forceinline__ int candidate_index(u64 c) { return (int)(~(u32)(c & 0xffffffffull)); }
__device__ __forceinline__ u32 candidate_key(u64 c) { return (u32)(c >> 32); }

// Write output slot i of a row: candidate c's index (logical, or physical through the row's
// block table) and score when `winner`, else -1 and -inf (padding).
__device__ __forceinline__ void write_slot(int i, u64 c, bool winner, const int* __restrict__ bt_row, int E,
                                           int num_blocks, int physical, int* __restrict__ out_idx,
                                           float* __restrict__ out_scores) {
    int idx = -1;
    float sc = -__int_as_float(0x7f800000);
    if (winner) {
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

// Output slot i of a row from sorted candidates: cand[i] when i < m (the winners), else padding.
__device__ __forceinline__ void write_winner(int i, u32 m, const u64* cand, const int* __restrict__ bt_row, int E,
                                             int num_blocks, int physical, int* __restrict__ out_idx,
                                             float* __restrict__ out_scores) {
    const bool winner = (u32)i < m;
    write_slot(i, winner ? cand[i] : 0ull, winner, bt_row, E, num_blocks, physical, out_idx, out_scores);
}

// ---------------------------------------------------------------------------
// Timeline points (scripts/probe_timeline.py). In a build with INDEXER_TIMELINE defined,
// TIMELINE_POINT(i, cond) has lane 0 of each warp where cond holds store %globaltimer into
// timeline_stamps[CTA][i][warp] (CTA: blockIdx.x + gridDim.x * blockIdx.y, the first
// kTimelineCtas of a grid): plain stores, one a warp (a probe by atomics added ~2 us
// to the very points it measured, docs/performance.md v72); at point 0 (the entry) warp 0
// also stores its SM's id + 1, and in bits 16-23 its warp slot on the SM (%warpid / 4, the
// slot ShareClaims sizes its first claim by), into timeline_smid[CTA] (0: no entry), for the
// SMs' ends; TIMELINE_TILES(n) has thread 0 store the tiles the CTA scored into
// timeline_tiles[CTA]. In every other build both are nothing, their arguments not even
// evaluated: the kernels compile as without them.
// ---------------------------------------------------------------------------
#ifdef INDEXER_TIMELINE
constexpr int kTimelineCtas = 4096, kTimelinePoints = 16, kTimelineWarps = 4;
__device__ unsigned long long timeline_stamps[kTimelineCtas * kTimelinePoints * kTimelineWarps];
__device__ unsigned int timeline_smid[kTimelineCtas];
__device__ unsigned int timeline_tiles[kTimelineCtas];
__device__ __forceinline__ unsigned int timeline_cta() { return blockIdx.x + gridDim.x * blockIdx.y; }
__device__ __forceinline__ void timeline_point(int i, bool cond) {
    const int warp = threadIdx.x >> 5;
    const unsigned int cta = timeline_cta();
    if (cond && (threadIdx.x & 31) == 0 && cta < kTimelineCtas && warp < kTimelineWarps) {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        timeline_stamps[(cta * kTimelinePoints + i) * kTimelineWarps + warp] = now;
        if (i == 0 && warp == 0) {
            unsigned int sm, w;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            asm volatile("mov.u32 %0, %%warpid;" : "=r"(w));
            timeline_smid[cta] = (sm + 1u) | ((w >> 2) << 16);
        }
    }
}
__device__ __forceinline__ void timeline_tiles_of(int n) {
    const unsigned int cta = timeline_cta();
    if (threadIdx.x == 0 && cta < kTimelineCtas) timeline_tiles[cta] = (unsigned int)n;
}
#define TIMELINE_POINT(i, cond) timeline_point((i), (cond))
#define TIMELINE_TILES(n) timeline_tiles_of(n)
#else
#define TIMELINE_POINT(i, cond) ((void)0)
#define TIMELINE_TILES(n) ((void)0)
#endif
