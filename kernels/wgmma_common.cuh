// wgmma_common.cuh: what the Hopper (sm_90a) scoring kernels share.
//
//   * wgmma: descriptors of shared-memory operands, fences, commit/wait, and the
//     MMA shapes the kernels issue (m64n64k16 with A in registers or shared memory; fp16
//     in, fp32 out);
//   * BulkRing: the key stream of one query row through a ring of shared-memory stages
//     filled by bulk copies (codes and scales of whole pool-block runs);
//   * the balanced schedule: the tiles of many rows, concatenated, cut into equal ranges.
#pragma once
#include "fast_common.cuh"
#include "bulk_copy.cuh"

namespace score_wgmma {
constexpr int kHeads = 64;          // N of the MMA: heads padded to 64
constexpr int kSubTile = 64;        // M of the MMA: entries per wgmma
constexpr int kCoreBytes = 128;     // 8 rows x 16 bytes
constexpr int kLbo = (kHeads / 8) * kCoreBytes;  // bytes between core matrices along K (1024)
constexpr int kStages = 4;          // shared-memory ring depth (tiles)
constexpr int kTile = 128;          // entries per ring stage: two sub-tiles
constexpr int kMaxBalancedRows = 1024;  // rows the balanced schedule holds in shared memory
// E2M1 goes through the hardware E4M3 conversion (values * 2^-6), so the scales carry 2^-2
// (score_mma.cu's logic-op decode has values * 2^-14 and scales * 2^6: the products are the
// same fp16 numbers; the conversion measured 7% faster here)
constexpr u32 kScaleMul = 0x34003400u;
// The wgmma kernels' epilogues (single-query and pair): the head groups (bit j: heads 8j ..
// 8j + 7) whose ReLU runs on the FMA pipe as 2 ReLU(x) = x + |x|, their weights halved (the
// query image, PrepToWgmmaImage); the other groups take max.NaN on the ALU pipe with whole
// weights (weighted_head_partials). Half and half keeps the two pipes level (single-query,
// per warp and tile: ALU 217, FMA 222 instructions, where all on the FMA pipe gave 182 and
// 255, docs/performance.md v109; the pair kernel's ALU 544 -> 480, FMA 379 -> 443, v110).
constexpr u32 kFmaReluGroups = 0xAAu;
__host__ __device__ constexpr bool fma_relu_head(int h) { return (kFmaReluGroups >> (h >> 3)) & 1u; }
}  // namespace score_wgmma

__device__ __forceinline__ u64 wgmma_desc(const void* smem_ptr, u32 lbo, u32 sbo) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem_ptr);
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)((lbo >> 4) & 0x3fffu) << 16) | ((u64)((sbo >> 4) & 0x3fffu) << 32);
}
// ... from its low word (address and leading byte offset, as wgmma_desc builds them) and sbo
__device__ __forceinline__ u64 wgmma_desc_of(u32 low, u32 sbo) { return (u64)low | ((u64)((sbo >> 4) & 0x3fffu) << 32); }

// The wgmma instructions exist on sm_90a only; elsewhere the launcher never picks this
// kernel, and the guards let the file compile for every target.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory"); }
#else
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void wgmma_commit() {}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {}
#endif

// The accumulators are written asynchronously: make every later read depend on this point.
template <int kN>
__device__ __forceinline__ void fence_accumulators(float (&d)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Eight consecutive accumulators d[i .. i + 7] as read-write asm operands: the wgmma
// wrappers below list 32 or 64 of them.
#define WGMMA_ACC8(d, i)                                                                        \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d (+)= A (registers, 64 x 16 fp16) * B (shared memory descriptor, 16 x 64 fp16, K-major)
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const u32 (&a)[4], u64 desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : WGMMA_ACC8(d, 0), WGMMA_ACC8(d, 8), WGMMA_ACC8(d, 16), WGMMA_ACC8(d, 24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#else
    __trap();  // sm_90a only; the launcher never picks this kernel elsewhere
#endif
}


// d (+)= A (registers, 64 x 16 fp16) * B (shared memory descriptor, 16 x 128 fp16, K-major):
// the pair kernel's two queries side by side (d[0..31]: the first query's 64 heads, d[32..63]
// the second's, each in the m64n64 fragment layout)
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], const u32 (&a)[4], u64 desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : WGMMA_ACC8(d, 0), WGMMA_ACC8(d, 8), WGMMA_ACC8(d, 16), WGMMA_ACC8(d, 24),
          WGMMA_ACC8(d, 32), WGMMA_ACC8(d, 40), WGMMA_ACC8(d, 48), WGMMA_ACC8(d, 56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#else
    __trap();  // sm_90a only; the launcher never picks this kernel elsewhere
#endif
}

// d (+)= A (shared memory descriptor, 64 x 16 fp16, K-major) * B (shared memory descriptor,
// 16 x 64 fp16, K-major)
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], u64 desc_a, u64 desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : WGMMA_ACC8(d, 0), WGMMA_ACC8(d, 8), WGMMA_ACC8(d, 16), WGMMA_ACC8(d, 24)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    __trap();  // sm_90a only; the launcher never picks this kernel elsewhere
#endif
}


// d (+)= A (shared memory descriptor, 64 x 16 fp16, K-major) * B (shared memory descriptor,
// 16 x 192 fp16, K-major): three queries side by side (d[32 qq .. 32 qq + 31]: query qq's
// 64 heads in the m64n64 fragment layout)
__device__ __forceinline__ void wgmma_m64n192k16_ss(float (&d)[96], u64 desc_a, u64 desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
        "%96, %97, p, 1, 1, 0, 0;\n}\n"
        : WGMMA_ACC8(d, 0), WGMMA_ACC8(d, 8), WGMMA_ACC8(d, 16), WGMMA_ACC8(d, 24),
          WGMMA_ACC8(d, 32), WGMMA_ACC8(d, 40), WGMMA_ACC8(d, 48), WGMMA_ACC8(d, 56),
          WGMMA_ACC8(d, 64), WGMMA_ACC8(d, 72), WGMMA_ACC8(d, 80), WGMMA_ACC8(d, 88)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    __trap();  // sm_90a only; the launcher never picks this kernel elsewhere
#endif
}

// The weighted head sum of one of my two rows of a finished m64n64 sub-tile (accumulators
// d; rows r0 and r0 + 8, heads 8j + 2c, +1 in this lane, the quad's four lanes summed).
// weights(j): the float2 weights of heads 8j + 2c, +1.
// ... this lane's part alone (its heads 8j + 2c, +1), before the quad's sum: .x row r0, .y r0 + 8.
// kFmaGroups: the j (bit j) whose sums run over 2 ReLU(x) (twice_relu_nan, an add on the FMA
// pipe, where max.NaN takes the ALU pipe) with the weights given halved (w / 2, by the caller):
// each product (w / 2) * 2 ReLU(x) is w * ReLU(x) exactly where w / 2 is exact, so the sums are
// the same bits, with no halving on the epilogue's chain (docs/performance.md v69). The
// wgmma kernels take it for half their heads (score_wgmma::kFmaReluGroups: their decode's
// logic ops and conversions load the ALU pipe; all heads so: decode-1M scoring -1.6%, v64; half
// of them a further -0.2..-1%, v109; the pair kernel's half -0.5..-1.9%, v110); the
// keys-stationary kernel, bound by its epilogue, lost ~4% with all heads so (every instruction
// of its epilogue then on the FMA pipe), the ws and dense kernels gained nothing
// (docs/performance.md v64).
template <u32 kFmaGroups = 0, typename Weights>
__device__ __forceinline__ float2 weighted_head_partials(const float (&d)[32], Weights weights) {
    // two partial sums per row (even and odd heads) halve the dependent FMA chain
    float lo0 = 0.0f, lo1 = 0.0f, hi0 = 0.0f, hi1 = 0.0f;
#pragma unroll
    for (int j = 0; j < score_wgmma::kHeads / 8; ++j) {
        auto relu = [j](float x) { return (kFmaGroups >> j) & 1u ? twice_relu_nan(x) : relu_nan(x); };
        const float2 wv = weights(j);
        lo0 = fmaf(wv.x, relu(d[4 * j]), lo0);
        lo1 = fmaf(wv.y, relu(d[4 * j + 1]), lo1);
        hi0 = fmaf(wv.x, relu(d[4 * j + 2]), hi0);
        hi1 = fmaf(wv.y, relu(d[4 * j + 3]), hi1);
    }
    return make_float2(lo0 + lo1, hi0 + hi1);
}

// ... the sum this lane stores: row r0 + 8 (c & 1) (lanes c and c ^ 2 get the same). The
// lanes c, c ^ 1 first swap the row each keeps for the partner's part of it, then c, c ^ 2 add
// their half sums: two shuffles and two adds where summing both rows in every lane took four
// and four (docs/performance.md v50), with the same association of the four lanes' parts,
// (p0 + p1) + (p2 + p3), so the same bits.
template <u32 kFmaGroups = 0, typename Weights>
__device__ __forceinline__ float weighted_head_sum_mine_of(const float (&d)[32], Weights weights, int c) {
    const float2 part = weighted_head_partials<kFmaGroups>(d, weights);
    const bool odd = c & 1;
    float mine = odd ? part.y : part.x;
    mine += __shfl_xor_sync(FULL_MASK, odd ? part.x : part.y, 1);
    mine += __shfl_xor_sync(FULL_MASK, mine, 2);
    return mine;
}

// ... with w the 64 weights in shared memory
template <u32 kFmaGroups = 0>
__device__ __forceinline__ float weighted_head_sum_mine(const float (&d)[32], const float* w, int c) {
    return weighted_head_sum_mine_of<kFmaGroups>(
        d, [&](int j) { return *reinterpret_cast<const float2*>(w + 8 * j + 2 * c); }, c);
}

// Where head h's weight goes among a query's 64 when they are stored in the order the
// epilogue's lanes read them: lane quad position c's heads 16i + 2c, +1, 16i + 8 + 2c, +1
// (j = 2i, 2i + 1 of weighted_head_partials) as the 16 bytes at 64i + 16c, so that a lane
// loads its 16 weights with four 16-byte loads (LaneWeights) where the head order took
// eight 8-byte ones, and the quad's four pieces of a load lie side by side. (Each lane's 16
// contiguous instead put the four pieces 64 bytes apart, two to a bank: the dense kernel,
// bound by its shared-memory pipe, lost 8.5% to that conflict, docs/performance.md v51.)
__device__ __forceinline__ int lane_order_weight(int h) {
    return ((h >> 4) * 4 + ((h >> 1) & 3)) * 4 + ((h >> 3) & 1) * 2 + (h & 1);
}

// weights(j) of weighted_head_partials from a lane's four float4s of lane-ordered weights:
// v[i] = the 16 bytes at 64i + 16c of its query's 64 weights
struct LaneWeights {
    float4 v[4];
    __device__ __forceinline__ float2 operator()(int j) const {
        const float4 x = v[j >> 1];
        return j & 1 ? make_float2(x.z, x.w) : make_float2(x.x, x.y);
    }
};

// ... with my weights in registers: w[j] = heads 8j + 2c, +1
__device__ __forceinline__ float weighted_head_sum_mine(const float (&d)[32], const float2 (&w)[8], int c) {
    return weighted_head_sum_mine_of(d, [&](int j) { return w[j]; }, c);
}

// The query of row t as a wgmma B operand, straight from the fp32 query, by one warpgroup
// (128 threads): prep_query_kernel's arithmetic (each head scaled by the power of two 2^e
// that brings max |q| into [2^14, 2^15), rounded to fp16; its weight times 2^(8 - e) to
// wsm; heads past H zero) in the core-matrix layout of score_wgmma (8 heads x 16 bytes a
// core matrix, `lbo` bytes between K chunks of 8 slots). Warp wp takes heads 16wp .. 16wp +
// 15, four at a time: lane group g = lane / 8 head 16wp + 4j + g of slot j, and lane r =
// lane % 8 (r < D/16) float4 r of each of the head's four quarters: each load instruction
// reads four heads' 128 contiguous bytes (whole lines at D = 128, where a lane a quarter
// made every load instruction touch 32 lines), and a head's maximum is three shuffles
// inside its lane group (four heads side by side). load() puts every load in flight (D/2
// registers), so that the caller can start other work before a store waits for them. Two K
// orders:
//   * store(): prep_query_kernel's (slot i holds dim prep_slot_dim(i): chunk c takes two
//     dims of each quarter, slots 2qd and 2qd + 1 dims qd * D/4 + 4(c / 2) + c % 2 and + 2),
//     the order of the A fragments score_wgmma.cu decodes into registers: a lane holds the
//     whole 16-byte rows of chunks 2r and 2r + 1;
//   * store_chunked() (D = 128): chunk kc holds dims 8kc .. 8kc + 7, slot j dim 8kc + (j
//     with bits 0 and 1 swapped), the order in which score_ws.cu decodes keys into shared
//     memory: a lane holds half of chunk 4qd + r / 2 of each quarter (8 bytes a store: a
//     warp's store writes four consecutive K chunks, two wavefronts where lbo is 32 bytes
//     off a multiple of 128, as the dense and warp-specialised kernels pad it, eight where
//     lbo is a multiple of 128: v52).
template <int kDim>
struct QueryStaging {
    static constexpr int kQuarter = kDim / 4, kLanes = kQuarter / 4, kSlots = 4;  // lanes a head, heads a lane
    static_assert(kDim % 32 == 0 && kDim <= 128, "D a multiple of 32, at most 128: a head's float4s in 8 lanes");
    float4 v[kSlots][4];  // [head slot][quarter]
    float wv[kSlots];

    __device__ static int head(int j) { return 16 * ((threadIdx.x >> 5) & 3) + 4 * j + ((threadIdx.x & 31) >> 3); }
    __device__ static int lane_in_head() { return threadIdx.x & 7; }

    // q: [T, H, kDim] of float, half_bits, bf16_bits or e4m3_bits (common.cuh), 4-element aligned
    template <class QT>
    __device__ __forceinline__ void load(const QT* __restrict__ q, const float* __restrict__ w, int H, long long t) {
        const int r = lane_in_head();
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
            const int h = head(j);
            const bool mine = h < H && r < kLanes;
            const QT* row = q + (t * H + h) * kDim;
#pragma unroll
            for (int qd = 0; qd < 4; ++qd)
                v[j][qd] = mine ? query_float4(row, r + qd * kLanes) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            wv[j] = h < H && r == 0 ? w[t * H + h] : 0.0f;
        }
    }

    // each slot's head maximum |q| (over its lane group)
    __device__ __forceinline__ void head_maxima(float (&amax)[kSlots]) const {
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
            amax[j] = 0.0f;
#pragma unroll
            for (int qd = 0; qd < 4; ++qd)
                amax[j] = fmaxf(amax[j], fmaxf(fmaxf(fabsf(v[j][qd].x), fabsf(v[j][qd].y)),
                                               fmaxf(fabsf(v[j][qd].z), fabsf(v[j][qd].w))));
        }
#pragma unroll
        for (int off = 1; off < 8; off <<= 1)
#pragma unroll
            for (int j = 0; j < kSlots; ++j) amax[j] = fmaxf(amax[j], __shfl_xor_sync(FULL_MASK, amax[j], off));
    }

    // Each of my heads in fp16 (scaled by 2^e, e = query_scale_exponent of its maximum):
    // store_head(j, h, sc, r) writes slot j's values (head h, lane r of its group) into B,
    // and the group's lane 0 its weight, w * 2^(8 - e), into wsm[h] (kLaneOrder:
    // wsm[lane_order_weight(h)]).
    template <bool kLaneOrder = false, bool kHalved = false, typename StoreHead>
    __device__ __forceinline__ void store_heads(float* wsm, StoreHead store_head) const {
        const int r = lane_in_head();
        float amax[kSlots];
        head_maxima(amax);
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
            const int h = head(j), e = query_scale_exponent(amax[j]);
            store_head(j, h, pow2_scale(e), r);
            if (r == 0) {  // 0 for heads past H; kHalved: halved where the epilogue takes 2 ReLU(x), as
                           // PrepToWgmmaImage halves prep_query_row's weight (the same bits)
                const float wt = ldexpf(wv[j], 8 - e);
                wsm[kLaneOrder ? lane_order_weight(h) : h] = kHalved && score_wgmma::fma_relu_head(h) ? 0.5f * wt : wt;
            }
        }
    }

    // lbo: bytes between K chunks (kLbo for one query's B; the pair kernel's two-query B,
    // 128 heads wide, has 2 * kLbo)
    template <bool kHalved = false>
    __device__ __forceinline__ void store(unsigned char* qb, float* wsm, int lbo = score_wgmma::kLbo) const {
        store_heads<false, kHalved>(wsm, [&](int j, int h, Pow2Scale sc, int r) {
            if (r >= kLanes) return;
            unsigned char* row = qb + (2 * r) * lbo + (h / 8) * score_wgmma::kCoreBytes + (h % 8) * 16;
            const float4* x = v[j];
            *reinterpret_cast<uint4*>(row) =  // chunk 2r: dims 4r and 4r + 2 of each quarter
                make_uint4(scaled_half2_bits(x[0].x, x[0].z, sc), scaled_half2_bits(x[1].x, x[1].z, sc),
                           scaled_half2_bits(x[2].x, x[2].z, sc), scaled_half2_bits(x[3].x, x[3].z, sc));
            *reinterpret_cast<uint4*>(row + lbo) =  // chunk 2r + 1: dims 4r + 1 and 4r + 3
                make_uint4(scaled_half2_bits(x[0].y, x[0].w, sc), scaled_half2_bits(x[1].y, x[1].w, sc),
                           scaled_half2_bits(x[2].y, x[2].w, sc), scaled_half2_bits(x[3].y, x[3].w, sc));
        });
    }

    template <bool kLaneOrder = false>
    __device__ __forceinline__ void store_chunked(unsigned char* qb, float* wsm, int lbo) const {
        static_assert(kDim == 128, "the chunked order's lanes hold dims 32qd + 4r .. + 3");
        store_heads<kLaneOrder>(wsm, [&](int j, int h, Pow2Scale sc, int r) {
#pragma unroll
            for (int qd = 0; qd < 4; ++qd) {  // dims 32qd + 4r .. + 3: half r % 2 of chunk 4qd + r / 2
                const float4 x = v[j][qd];
                *reinterpret_cast<uint2*>(qb + (4 * qd + r / 2) * lbo + (h / 8) * score_wgmma::kCoreBytes + (h % 8) * 16 +
                                          (r % 2) * 8) =
                    make_uint2(scaled_half2_bits(x.x, x.z, sc), scaled_half2_bits(x.y, x.w, sc));
            }
        });
    }
};

// Shared-memory bytes of one ring stage (codes, then scales), 128-byte aligned.
__host__ __device__ constexpr int wgmma_stage_bytes(int D) {
    return ((score_wgmma::kTile * (D / 2) + score_wgmma::kTile * (D / 16)) + 127) / 128 * 128;
}

// ---------------------------------------------------------------------------
// The key stream of one CTA through one query row: tiles of 128 entries land in a ring of
// kStages shared-memory stages by bulk copies, one per (tile, pool block) for the codes and
// one for the scales, run r of a tile issued by warp r % 4 from one elected lane, its block
// id prefetched by lane r / 4 (run_of, issue; E a power of two: a tile covers 128 / E whole
// blocks, or 128 entries of one block), kS - 1 tiles ahead, once the current tile's MMAs are
// issued (refill_after_mma). A copy reports to its stage's mbarrier, at which each run's
// issuing lane arrives once per tile (ring_arrivals: the kernels initialise the barriers with
// that count), so one wait tells a thread the whole tile has landed. Block ids and global
// scales are loaded two and one tiles ahead (registers), so no thread waits on its own
// global loads. Pool blocks that are out of range or past the row's visible end are not
// copied: their stage rows keep stale bytes and their global scale reads NaN, so their
// scores are NaN (never selected) or lie past n (never read).
// ---------------------------------------------------------------------------
// Named barrier of `threads` threads (id 0 is __syncthreads' barrier): one warpgroup's sync
// in a warp-specialised CTA.
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Which warps of this CTA issue a tile's key copies: run r goes to warp (r + rot) % 4, rot =
// {0, 2, 1, 3}[(slot of warp 0 >> 2) % 4] (slot: %warpid; read by one thread and shared,
// so that the CTA's warps agree). Kept for what it measured, not for the model it was
// built on: an SM puts CTA k's warp i in slot 4k + (i + k + d) % 4 (d = 0 or 1 by SM;
// slot w runs on scheduler w % 4), so unrotated the three CTAs' six issuing warps at E = 64
// already fell 1, 2, 2, 1 on the schedulers and this rotation puts them 3, 1, 0, 2. Yet it
// measured faster in the single-query kernel (v69: -0.4..-1.2%; level with rot = 0 in v70
// but on decode-E256, -1.0%), while issuers spread 2, 2, 1, 1 by their schedulers were
// 0.3-1.6% slower, all CTAs' on the same two (3, 3, 0, 0) 0.7-1.6% slower, and the pair
// kernel lost 0.9% to it (it keeps rot = 0): docs/performance.md v69-v70.
__device__ __forceinline__ int issue_rotation() {
    u32 slot;
    asm volatile("mov.u32 %0, %%warpid;\n" : "=r"(slot));
    return (0x3120 >> (4 * ((slot >> 2) & 3))) & 3;
}

// Arrivals per tile at a BulkRing stage's barrier: one per issuing thread (e_shift = log2 E).
__device__ __forceinline__ u32 ring_arrivals(int e_shift) { return (u32)(score_wgmma::kTile >> (e_shift < 7 ? e_shift : 7)); }

// kScaleSelect: scale_of's form (the pair kernel's; see there)
template <int kDim, int kStagesT = score_wgmma::kStages, bool kScaleSelect = false>
struct BulkRing {
    static constexpr int kCodeBytes = kDim / 2, kScaleBytes = kDim / 16;
    static constexpr int kStageBytes = wgmma_stage_bytes(kDim);
    static constexpr int kScaleOffset = score_wgmma::kTile * kCodeBytes;
    static constexpr int kS = kStagesT;

    unsigned char* ring;  // [kS][kStageBytes]
    float* meta_gs;       // [kS][kTile]: global scale of each copy (index: row >> row_shift)
    u64* bars;            // [kS]
    const u8* __restrict__ keys_fp4;
    const u8* __restrict__ key_scale;
    const float* __restrict__ key_gscale;
    const int* __restrict__ bt;  // this row's block table
    int P, E, e_shift, n, first_tile, num_tiles, jbase;
    int row_shift;        // log2(rows per copy) = log2(min(E, 128))
    int copies;           // copies per tile = 128 >> row_shift
    int b_next2, b_next;  // prefetched block ids (tiles it + kS, it + kS - 1 ... see advance)
    float g_next;

    int rot;              // the CTA's issuing-warp rotation (issue_rotation)

    // The block run of every tile whose block id and global scale this thread prefetches:
    // lane l of warp w takes run (w - rot) % 4 + 4l, so that a tile's few runs (2 at E = 64)
    // go to different warps, which issue them (issue).
    __device__ int run_of(int tid) const { return (((tid >> 5) - rot) & 3) + 4 * (tid & 31); }
    // Does this thread prefetch for a run (its run < copies)?
    __device__ bool issuer(int tid) const { return run_of(tid) < copies; }

    // the row entry my run of tile j of this segment starts at
    __device__ int run_entry(int j, int tid) const {
        return (first_tile + j) * score_wgmma::kTile + (run_of(tid) << row_shift);
    }
    // block id of my run of tile j of this segment, -1 when not visible or out of range
    __device__ int block_of(int j, int tid) const {
        const int s = run_entry(j, tid);
        if (j >= num_tiles || s >= n) return -1;
        const int b = bt[s >> e_shift];
        return (b >= 0 && b < P) ? b : -1;
    }
    // ... the same for every thread, without a branch: -1 where this thread issues no run.
    // The load is unconditional (the row's first block id where no run: the table has at
    // least one column on every call), so that the tile loop's refill has no branch region
    // around it (with the pair kernel's scale select, mtp-2 scoring -1.5%; performance.md v109).
    __device__ int issuer_block_of(int j, int tid) const {
        const int s = run_entry(j, tid);
        const bool mine = issuer(tid) && j < num_tiles && s < n;
        const int b = bt[mine ? s >> e_shift : 0];
        return (mine && b >= 0 && b < P) ? b : -1;
    }
    // b's global scale, NaN for no block (-1). kScaleSelect: the load unconditional (block 0's
    // for b < 0: every call has P >= 1) and then a select, so that the refill has no branch
    // region around it: the pair kernel's scoring -0.8% (mtp-2); in the single-query kernel
    // the same form cost a spill in the tile loop and was 0.4-0.9% slower (performance.md v109).
    __device__ float scale_of(int b) const {
        if constexpr (kScaleSelect) {
            const float g = key_gscale[b >= 0 ? b : 0];
            return b >= 0 ? g : __int_as_float(0x7fc00000);
        } else {
            return b >= 0 ? key_gscale[b] : __int_as_float(0x7fc00000);
        }
    }

    // Issue tile j (segment-relative) into its stage, one arrival a run, and store its runs'
    // global scales; called by every thread, converged. The runs of warp w (w, w + 4, ...)
    // are held by its lanes 0, 1, ... (b, g: run_of's); the warps take them in turn, each
    // lane's operands broadcast so that ptxas knows them warp-uniform and one elected lane
    // issues the copies straight from uniform registers (a copy whose operands might differ
    // by lane is wrapped in a loop over their distinct values: ELECT, R2UR, PLOP3, a branch
    // back). At E >= 32 (at most four runs a tile) a warp has one run at most. kCopies,
    // kScales: the copies (and arrivals), the global scales' stores; the tile loop's refill
    // does both (issue), a segment's start each apart (start_copies, store_start_scales).
    template <bool kCopies, bool kScales>
    __device__ void issue_runs(int j, int tid, int b, float g) {
        const int slot = (u32)(jbase + j) % kS;
        const u32 bar = smem_u32(bars + slot);
        const u32 st = smem_u32(ring) + slot * kStageBytes;
        const int rows = 1 << row_shift;
        const u32 code_bytes = rows * kCodeBytes, scale_bytes = rows * kScaleBytes;
        const int tile_start = (first_tile + j) * score_wgmma::kTile;
        const int warp = __shfl_sync(~0u, tid >> 5, 0);  // known warp-uniform
        const bool leader = elect_one();
        auto one_run = [&](int i) {
            const int bi = kCopies ? __shfl_sync(~0u, b, i) : 0;
            const float gi = kScales ? __shfl_sync(~0u, g, i) : 0.0f;
            const int r = ((warp - rot) & 3) + 4 * i;
            if (leader && r < copies) {
                if (kCopies) {
                    if (bi >= 0) {
                        const int s = tile_start + (r << row_shift);
                        const long long ent = (long long)bi * E + (s & (E - 1));
                        mbar_arrive_expect_tx(bar, code_bytes + scale_bytes);
                        bulk_copy_g2s_evict_first(st + r * code_bytes, keys_fp4 + ent * kCodeBytes, code_bytes, bar);
                        bulk_copy_g2s_evict_first(st + kScaleOffset + r * scale_bytes,
                                                  key_scale + ent * kScaleBytes, scale_bytes, bar);
                    } else {
                        mbar_arrive(bar);
                    }
                }
                // The global scale is stored after the copies are on their way (at a segment's
                // start g is a load that depends on b: waiting for it first would delay the
                // tile by a round trip). Readers see it: this thread stores it before the
                // end_reads barrier of its iteration (or the segment prologue's barrier), and
                // they read it after that barrier.
                if (kScales) meta_gs[slot * score_wgmma::kTile + r] = gi;
            }
        };
        one_run(0);
        for (int i = 1; 4 * i < copies; ++i) one_run(i);  // small blocks (E < 32) only
    }
    __device__ void issue(int j, int tid, int b, float g) { issue_runs<true, true>(j, tid, b, g); }

    // A segment's start: tiles 0 .. kS - 2 issued, block ids of the next two tiles and the
    // global scale of the next one in flight. start does it tile by tile: each tile's copies
    // wait for its block id, then its scale (the pair kernel: its tile loop compiled far
    // worse with the steps apart, its descriptors out of the uniform registers, and spills;
    // docs/performance.md v73). The single-query kernel takes four steps instead (start_ids,
    // start_copies, start_scale_loads, store_start_scales), with its query's copies between
    // them: the block ids of all these tiles go out together (one round trip), then their
    // global scales (one more), and no copy waits for a scale. Tile by tile, its CTAs reached
    // the query's wait only after six such round trips, ~0.6 us each under a wave's start
    // traffic (scripts/probe_timeline.py).
    __device__ void start(int tid) {
        for (int j = 0; j < kS - 1; ++j) {
            const int b = j < num_tiles && issuer(tid) ? block_of(j, tid) : -1;
            if (j < num_tiles) issue(j, tid, b, scale_of(b));
        }
        b_next = issuer(tid) ? block_of(kS - 1, tid) : -1;
        b_next2 = issuer(tid) ? block_of(kS, tid) : -1;
        g_next = scale_of(b_next);
    }
    // 1. the block ids (loads)
    __device__ void start_ids(int tid, int (&b_first)[kS - 1]) {
#pragma unroll
        for (int j = 0; j < kS - 1; ++j) b_first[j] = issuer(tid) ? block_of(j, tid) : -1;
        b_next = issuer(tid) ? block_of(kS - 1, tid) : -1;
        b_next2 = issuer(tid) ? block_of(kS, tid) : -1;
    }
    // 2. tiles [j0, j1) of the first kS - 1 copied (waits for their block ids)
    __device__ void start_copies(int tid, int j0, int j1, const int (&b_first)[kS - 1]) {
#pragma unroll
        for (int j = j0; j < j1; ++j)
            if (j < num_tiles) issue_runs<true, false>(j, tid, b_first[j], 0.0f);
    }
    // 3. the global scales of the first tiles and the next one (loads)
    __device__ void start_scale_loads(const int (&b_first)[kS - 1], float (&g_first)[kS - 1]) {
#pragma unroll
        for (int j = 0; j < kS - 1; ++j) g_first[j] = scale_of(b_first[j]);
        g_next = scale_of(b_next);
    }
    // 4. the first tiles' global scales stored (waits for them), before the caller's barrier
    __device__ void store_start_scales(int tid, const float (&g_first)[kS - 1]) {
#pragma unroll
        for (int j = 0; j < kS - 1; ++j)
            if (j < num_tiles) issue_runs<false, true>(j, tid, 0, g_first[j]);
    }

    // Top of iteration it: wait for tile it.
    __device__ void begin_tile(int it, int tid) {
        const int j = jbase + it;
        mbar_wait(bars + (u32)j % kS, ((u32)j / kS) & 1u);
    }
    // Within iteration it, after this thread's last read of the stage (its decode and global
    // scales) and before it waits for the MMAs: a CTA barrier, after which the stage of tile
    // it may be refilled (by refill_after_mma of iteration it + 1). Here the warps that
    // finish their reads first wait where they would wait for the MMAs anyway.
    __device__ void end_reads() { __syncthreads(); }
    // Within iteration it, once its MMAs are issued: issue tile it + kS - 1 into the stage of
    // tile it - 1 (free since end_reads of iteration it - 1), advance the prefetch. The issuing
    // threads' copy and address work then runs while the tensor cores work, not between the
    // barrier and the first MMA, where the whole warpgroup waited for it at the first wgmma.
    __device__ void refill_after_mma(int it, int tid) {
        if (it + kS - 1 < num_tiles) issue(it + kS - 1, tid, b_next, g_next);
        b_next = b_next2;
        g_next = scale_of(b_next);
        b_next2 = issuer_block_of(it + kS + 1, tid);
    }
    __device__ const unsigned char* stage(int it) const { return ring + (u32)(jbase + it) % kS * kStageBytes; }
    // The global scale of stage row `row` of tile it, in two parts: its byte offset within a
    // slot (loop-invariant: computed once, outside the tile loop) and the load, one shared
    // load at a register + uniform address (by the row index each tile, a multiply-add and
    // a shift-add a row more).
    __device__ u32 gscale_offset(int row) const { return (u32)(row >> row_shift) * 4u; }
    __device__ float gscale_at(int it, u32 offset) const {
        return __int_as_float(ld_shared_s32(smem_u32(meta_gs) + (u32)(jbase + it) % kS * (score_wgmma::kTile * 4) + offset));
    }
};

// Towards L2, by one warp (lane i takes the row's block i): the keys, scales and global
// scales of a row's first `entries` entries (its block table bt, L wide; visible length n),
// so that a segment starting on that row later finds its first tiles' block ids and keys in
// L2 instead of HBM: asked for by the segment before it in the same CTA, whose start on the
// new row otherwise waits for two dependent HBM round trips (the block ids, then the keys;
// docs/performance.md v72). A hint: nothing waits for it.
template <int kDim>
__device__ __forceinline__ void prefetch_row_start_l2(const int* __restrict__ bt, int L, int n, int entries, int P,
                                                      int E, int e_shift, const u8* keys_fp4, const u8* key_scale,
                                                      const float* key_gscale, int lane) {
    const int ents = min(min(entries, n), L * E);
    if (lane >= min(32, (ents + E - 1) >> e_shift)) return;
    const int b = bt[lane];
    if (b < 0 || b >= P) return;
    // whole 16-byte granules: E * kDim / 16 is a multiple of 16 (the launcher checks it), and
    // so is min(E, 128 j) * kDim / 16 for the entries asked (multiples of 128)
    const u32 rows = (u32)min(E, entries);
    bulk_prefetch_l2(keys_fp4 + (long long)b * E * (kDim / 2), rows * (kDim / 2));
    bulk_prefetch_l2(key_scale + (long long)b * E * (kDim / 16), rows * (kDim / 16));
    prefetch_line_l2(key_gscale + b);
}

// My (fragment column c) code words of stage row `row` and the fp16x2 scale splats
// (the stage layout of BulkRing: codes [128][D/2], then scales [128][D/16]).
template <int kDim>
__device__ __forceinline__ void read_stage_row(const unsigned char* st, int row, int c, u32 (&raw)[kDim / 32],
                                               u32 (&sc)[kDim / 32]) {
    static_assert(KeyRing<kDim>::kCodeBytes == BulkRing<kDim>::kCodeBytes &&
                  KeyRing<kDim>::kScaleOffset == BulkRing<kDim>::kScaleOffset, "same stage layout as KeyRing");
    read_row<kDim, score_wgmma::kScaleMul>(st, row, c, raw, sc);
}


// One entry's 32 dims (its 16 code bytes and scale groups 2 qd, 2 qd + 1) decoded from
// E2M1 x E4M3 to fp16 (times 2^-8, exact) into K chunks 4 qd .. 4 qd + 3 of a K-major
// core-matrix layout: entry e's 16-byte row of chunk kc at dst + kc * lbo + (e / 8) * 128 +
// (e % 8) * 16, in score_ws.cu's K order (QueryStaging::store_chunked's). Zero codes and
// scales give zeros. score_dense.cu decodes its key image with it; score_ws.cu keeps its own
// copy of the loop, which through this function measured 0.3-0.4 us slower at batch 1
// (the kernel's register allocation moved; docs/performance.md v33).
__device__ __forceinline__ void decode_quarter_chunked(unsigned char* dst, int lbo, int e, int qd, uint4 code,
                                                       u32 scale2) {
    const u32 sv = scales_to_f16x2<score_wgmma::kScaleMul>(scale2);
    const u32 words[4] = {code.x, code.y, code.z, code.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        u32 d[4];
        e2m1x8_to_f16x2_cvt(words[w], d);  // dims 8 kc + {0,2}, {1,3}, {4,6}, {5,7}
        const u32 sc = w < 2 ? splat_lo(sv) : splat_hi(sv);
        *reinterpret_cast<uint4*>(dst + (4 * qd + w) * lbo + (e >> 3) * 128 + (e & 7) * 16) =
            make_uint4(hmul2(d[0], sc), hmul2(d[1], sc), hmul2(d[2], sc), hmul2(d[3], sc));
    }
}

// The A fragments (kDim/16 k-steps) of one 64-entry sub-tile of a BulkRing stage (score_wgmma.cu;
// kernels/probe_wgmma.cu times them):
// my rows r0 = base + 16*warp + g and r0 + 8, decoded from E2M1 x E4M3 to fp16.
template <int kDim>
__device__ __forceinline__ void decode_sub_tile(const unsigned char* st, int r0, int c, u32 (&a)[kDim / 16][4]) {
    constexpr int kWords = kDim / 32;
    u32 raw0[kWords], sc0[kWords], raw1[kWords], sc1[kWords];
    read_stage_row<kDim>(st, r0, c, raw0, sc0);
    read_stage_row<kDim>(st, r0 + 8, c, raw1, sc1);
#pragma unroll
    for (int wd = 0; wd < kWords; ++wd) {
        u32 d0[4], d1[4];
        e2m1x8_to_f16x2_cvt(raw0[wd], d0);
        e2m1x8_to_f16x2_cvt(raw1[wd], d1);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            d0[i] = hmul2(d0[i], sc0[wd]);
            d1[i] = hmul2(d1[i], sc1[wd]);
        }
        // k-step 2wd: (lo nibbles, hi nibbles) of bytes 0-1; k-step 2wd+1: bytes 2-3
        a[2 * wd][0] = d0[0]; a[2 * wd][1] = d1[0];
        a[2 * wd][2] = d0[1]; a[2 * wd][3] = d1[1];
        a[2 * wd + 1][0] = d0[2]; a[2 * wd + 1][1] = d1[2];
        a[2 * wd + 1][2] = d0[3]; a[2 * wd + 1][3] = d1[3];
    }
}

// One commit group: acc = A (a sub-tile's fragments) x B (the query at descriptor desc),
// over the kDim/16 k-steps.
template <int kDim>
__device__ __forceinline__ void mma_sub_tile(float (&acc)[32], const u32 (&a)[kDim / 16][4], u64 desc) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks)
        wgmma_m64n64k16(acc, a[ks], desc + (u64)((2 * ks * score_wgmma::kLbo) >> 4), ks > 0);
    wgmma_commit();
}

// The balanced schedule's tile starts, by one CTA of kThreads threads: start[i] = the tiles of
// items 0 .. i-1 (rows, or row pairs), start[n] = the total, which is returned; tiles(i) is
// item i's tile count, n <= kMax. Its barriers also publish what the CTA wrote before.
template <int kMax, int kThreads = 128, typename TilesOf>
__device__ __forceinline__ u32 tile_starts(int n, TilesOf tiles, int* start, u32* scratch) {
    constexpr int kPer = (kMax + kThreads - 1) / kThreads;
    const int tid = threadIdx.x;
    u32 mine[kPer], sum = 0u;
    // every item's loads unconditional (items past n read item n - 1's, counted as none):
    // loads under `i < n` went out three at a time, the others one after another, a round
    // trip each (ptxas; v73)
    if (n > 0) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) mine[j] = (u32)tiles(min(tid * kPer + j, n - 1));
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) sum += tid * kPer + j < n ? mine[j] : 0u;
    u32 total;
    u32 base = block_exclusive_scan<kThreads>(sum, scratch, &total);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int i = tid * kPer + j;
        if (i < n) start[i] = (int)base;
        base += mine[j];
    }
    if (tid == 0) start[n] = (int)total;
    __syncthreads();
    return total;
}

// floor(a * b / c), c > 0: through a double quotient (exact operands, a * b < 2^53), within
// one of the floor, which one step each way corrects. The 64-bit integer division it
// replaces is a subroutine call (__cuda_sm20_div_u64) whose dependent chain put ~1 us
// between a CTA's schedule and its first claim's tiles (scripts/probe_timeline.py, v73).
__device__ __forceinline__ u32 mul_div_floor(u32 a, u32 b, u32 c) {
    const unsigned long long num = (unsigned long long)a * b;
    unsigned long long q = (unsigned long long)((double)num / (double)c);
    if (q * c > num) --q;
    else if ((q + 1) * c <= num) ++q;
    return (u32)q;
}

// Shares of a one-wave balanced schedule, claimed rather than fixed (docs/performance.md
// v71). An SM's warp schedulers favour the warps of its first CTA over its second's and
// those over its third's: with equal shares of tiles the SM's three CTAs ended ~4% and ~11%
// apart (a probe of every CTA's start and end), so that each SM ran its last ~10% with one
// or two CTAs. So a CTA claims its share from a counter in global memory: first units sized
// by its slot on the SM (its first warp's %warpid / 4), then chunks, until the counter
// passes the end. Tiles are claimed in units (kUnits an equal share), so that the first
// claim needs no tile count and can be issued before the schedule is built; claimed units
// [u0, u1) are tiles [total * u0 / U, total * u1 / U) of all rows' tiles in order, U = G *
// kUnits. The counters (claimed units, CTAs done) are zero when the kernel starts; the last
// CTA to finish sets them back to zero. Without counters each CTA takes its equal share
// through the same code (a branch around the tile loop would have ptxas compile it twice).
struct ShareClaims {
    static constexpr u32 kUnits = 1024;
    // first claims by slot, in proportion to the slots' measured speeds; an SM's three add
    // up to its 3 kUnits, so that chunks are claimed only where the wave's CTAs are not
    // three to every SM
    __device__ u32 first_units() const {
        u32 w;
        asm volatile("mov.u32 %0, %%warpid;\n" : "=r"(w));
        const u32 slot = w >> 2;
        return slot < 3 ? first[slot] : kUnits;
    }

    u32* counter;  // global [2]: units claimed, CTAs done; nullptr: equal shares, none claimed
    u32* mine;     // shared [3]: this CTA's last claim (first unit, units), all rows' tiles
    u32 first[3];  // first claims of slots 0, 1, 2 (adding up to 3 kUnits)

    // The claims are made by the whole of one warp (lane 0 adds the units, the other lanes
    // add zero; every lane stores lane 0's answer), called by every thread: a claim under
    // `tid == 0` diverged inside the loop around the tile loop, and ptxas then moved the
    // tile loop's descriptors out of the uniform registers. The warp waits for the atomic
    // where it makes it (ptxas aggregates it over the warp and shuffles the answer at once).
    __device__ void store_claim(u32 at_or_none, u32 units, int by_warp = 0) const {
        const int lane = threadIdx.x & 31;
        if (__shfl_sync(~0u, threadIdx.x >> 5, 0) == by_warp) {  // known warp-uniform
            const u32 old = counter ? atomicAdd(counter, lane == 0 ? units : 0u) : at_or_none;
            mine[0] = __shfl_sync(~0u, old, 0);
            mine[1] = units;
        }
    }
    // the CTA's first share (without counters its equal share, units [blockIdx.x * kUnits,
    // + kUnits), which are tiles [total * blockIdx.x / G, total * (blockIdx.x + 1) / G)), by
    // warp by_warp: the single-query kernel's last, whose atomic's round trip then runs
    // beside warp 0's loads of the row lengths (tile_starts) instead of before them (v73)
    __device__ void claim_first(int by_warp = 0) const {
        store_claim(blockIdx.x * kUnits, counter ? first_units() : kUnits, by_warp);
    }
    // by one thread: the tiles of all rows, to read the claims by (kept in shared memory,
    // not in registers across the tile loop, where ptxas has none to spare)
    __device__ void set_total(u32 total) const { mine[2] = total; }
    // a chunk more, at least one tile (without counters, none: the wave is done)
    __device__ void claim() const {
        const u32 U = gridDim.x * kUnits;
        const u32 total = mine[2];
        store_claim(U, max(16u, total ? mul_div_floor(U + total - 1, 1u, total) : 1u));
    }
    // the tiles [g, g_end) of the CTA's last claim, in all rows' tiles in order; false once
    // the wave is done
    __device__ bool tiles(int& g, int& g_end) const {
        const u32 U = gridDim.x * kUnits;
        const u32 u0 = mine[0], total = mine[2];
        if (u0 >= U) return false;
        const u32 u1 = (u32)min((unsigned long long)u0 + mine[1], (unsigned long long)U);
        g = (int)mul_div_floor(total, u0, U);
        g_end = (int)mul_div_floor(total, u1, U);
        return true;
    }
    // by one thread, after its CTA's last claim: count the CTA done; the last one clears both
    // counters for the next launch (every other CTA has made its last claim by then)
    __device__ void done() const {
        if (!counter) return;
        __threadfence();  // this CTA's claims before its count
        if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
            atomicExch(counter, 0u);
            atomicExch(counter + 1, 0u);
        }
    }
};

// The item holding tile g: the last i < n with start[i] <= g (empty items share starts).
template <typename Pos>
__device__ __forceinline__ int item_of_tile(const Pos* start, int n, Pos g) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (start[mid] <= g) lo = mid; else hi = mid - 1;
    }
    return lo;
}

