// score_wgmma.cu: the fast scoring path on Hopper's warpgroup MMA (wgmma, sm_90a).
//
// Same contract and workspace as score_mma.cu, for H <= 64 and D <= 128. One warpgroup (4
// warps) per CTA computes 64 entries x 64 heads per wgmma.m64n64k16:
//   * A = keys, decoded from NVFP4 into registers with the same fragment layout and K
//     permutation as for mma.sync (the wgmma A fragment of each warp is the m16n8k16 one),
//     through the hardware E4M3 conversion; two 64-entry sub-tiles with their own
//     accumulators in flight: the MMAs of one overlap the decode or epilogue of the other;
//   * B = the query, in shared memory in wgmma's K-major core-matrix layout (8 heads x 8
//     K-values per 128-byte core matrix; core matrices 128 bytes apart along the heads,
//     1024 bytes apart along K), in the same permuted K order as the decode;
//   * accumulators (2 x 32 floats a thread) read by the epilogue only after wgmma.wait_group.
// Keys stream through KeyRing (fast_common.cuh); the epilogue is score_mma.cu's.
#include "fast_common.cuh"

namespace score_wgmma {
constexpr int kHeads = 64;          // N of the MMA: heads padded to 64
constexpr int kSubTile = 64;        // M of the MMA: entries per wgmma
constexpr int kCoreBytes = 128;     // 8 rows x 16 bytes
constexpr int kLbo = (kHeads / 8) * kCoreBytes;  // bytes between core matrices along K (1024)
// E2M1 through the hardware E4M3 conversion (values * 2^-6, scales * 2^-2) rather than
// logic ops (values * 2^-14, scales * 2^6); the products are the same fp16 numbers
constexpr bool kCvtDecode = true;
constexpr u32 kScaleMul = kCvtDecode ? 0x34003400u : 0x54005400u;
}  // namespace score_wgmma

__device__ __forceinline__ u64 wgmma_desc(const void* smem_ptr, u32 lbo, u32 sbo) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem_ptr);
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)((lbo >> 4) & 0x3fffu) << 16) | ((u64)((sbo >> 4) & 0x3fffu) << 32);
}

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
__device__ __forceinline__ void fence_accumulators(float (&d)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A (registers, 64 x 16 fp16) * B (shared memory descriptor, 16 x 64 fp16, K-major)
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const u32 (&a)[4], u64 desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#else
    __trap();  // sm_90a only; the launcher never picks this kernel elsewhere
#endif
}

template <int kDim>
__global__ void __launch_bounds__(128, 3)
score_wgmma_kernel(const unsigned short* __restrict__ q16,  // [T, 64, kDim + 8] from prep_query_kernel<kDim, 8>
                   const float* __restrict__ w_scaled,      // [T, 64]
                   const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                   const u8* __restrict__ key_scale,        // [P, E, D/16]
                   const float* __restrict__ key_gscale,    // [P]
                   const int* __restrict__ block_table,     // [T, L]
                   const int* __restrict__ valid_lens,      // [T]
                   int P, int E, int e_shift, int L, int tiles_per_cta,
                   float* __restrict__ scores,              // [T, ld] workspace
                   long long ld,
                   u32* __restrict__ hist)                  // [T, kHistBins]
{
    using namespace score_wgmma;
    using Ring = KeyRing<kDim>;
    static_assert(kDim % 32 == 0 && kDim >= 32 && kDim <= 128, "D must be a multiple of 32 in [32, 128]");
    constexpr int kWords = kDim / 32, kKSteps = kDim / 16;
    constexpr int kRowHalves = kDim + 8;                   // row of q16 in global memory
    constexpr int kQBytes = (kDim / 8) * kLbo;             // B in core-matrix layout
    constexpr int kThreads = 128, kTile = score_mma::kTileEntries;
    constexpr int kHistBins = score_mma::kHistBins;

    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* qb = smem;                                            // [D/8][8][8 heads][16 B]
    float* wsm = reinterpret_cast<float*>(smem + kQBytes);               // [64]
    unsigned char* ring_smem = reinterpret_cast<unsigned char*>(wsm + kHeads);
    u32* hist_s = reinterpret_cast<u32*>(ring_smem + Ring::kSmemBytes);  // [kHistBins]

    const int t = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    Ring keys;
    if (!keys.init(ring_smem, keys_fp4, key_scale, key_gscale, block_table, valid_lens, t, P, E, e_shift, L,
                   tiles_per_cta))
        return;  // uniform: this CTA's tiles lie past the row's end
    const int n = keys.n, first_tile = keys.first_tile, num_tiles = keys.num_tiles;

    // ---- prologue: the query into the core-matrix layout (first copy group), weights,
    // metadata and copies of the first stages
    {
        const unsigned short* qsrc = q16 + (long long)t * kHeads * kRowHalves;
        for (int i = tid; i < kHeads * (kDim / 8); i += kThreads) {
            const int h = i / (kDim / 8), kc = i % (kDim / 8);
            cp_async_16(qb + kc * kLbo + (h / 8) * kCoreBytes + (h % 8) * 16, qsrc + h * kRowHalves + kc * 8, true);
        }
        for (int h = tid; h < kHeads; h += kThreads) wsm[h] = w_scaled[(long long)t * kHeads + h];
    }
    for (int i = tid; i < kHistBins; i += kThreads) hist_s[i] = 0u;
    keys.prime_metadata(tid);
    __syncthreads();
    keys.start_copies(tid);  // group 0 also holds the query copied above

    const int g = lane >> 2, c = lane & 3;
    float* out = scores + (long long)t * ld;
    // Sub-tile u of a tile accumulates into acc[u] from a_frag[u]: both sub-tiles' MMAs are
    // in flight at once, so sub-tile 0's MMAs overlap sub-tile 1's decode and sub-tile 1's
    // MMAs overlap sub-tile 0's epilogue.
    u32 a_frag[2][kKSteps][4];
    float acc[2][32];
    // weighted head sum of rows r0 and r0 + 8 of a finished sub-tile (entries s0, s0 + 8)
    auto epilogue = [&](const float (&d)[32], int s0, float g0, float g1) {
        // two partial sums per row (even and odd heads) halve the dependent FMA chain
        float lo0 = 0.0f, lo1 = 0.0f, hi0 = 0.0f, hi1 = 0.0f;
#pragma unroll
        for (int j = 0; j < kHeads / 8; ++j) {
            const float2 wv = *reinterpret_cast<const float2*>(wsm + 8 * j + 2 * c);  // heads 8j+2c, +1
            lo0 = fmaf(wv.x, relu_nan(d[4 * j]), lo0);
            lo1 = fmaf(wv.y, relu_nan(d[4 * j + 1]), lo1);
            hi0 = fmaf(wv.x, relu_nan(d[4 * j + 2]), hi0);
            hi1 = fmaf(wv.y, relu_nan(d[4 * j + 3]), hi1);
        }
        float lo = lo0 + lo1, hi = hi0 + hi1;
        lo += __shfl_xor_sync(FULL_MASK, lo, 1);
        hi += __shfl_xor_sync(FULL_MASK, hi, 1);
        lo += __shfl_xor_sync(FULL_MASK, lo, 2);
        hi += __shfl_xor_sync(FULL_MASK, hi, 2);
        if (c == 0) store_score(out, s0, lo, g0, n, hist_s);
        if (c == 1) store_score(out, s0 + 8, hi, g1, n, hist_s);
    };

    for (int it = 0; it < num_tiles; ++it) {
        keys.begin_tile(it, tid);
        const unsigned char* st = keys.stage(it);
        const float* gs = keys.gs(it);
        const int tile_start = (first_tile + it) * kTile;
        // Sub-tile 0's MMAs run while sub-tile 1 decodes, and sub-tile 1's while sub-tile
        // 0's epilogue runs. No MMA stays in flight across iterations: ptxas serialises
        // every wgmma when accumulators are read in a pipeline stage crossing the loop's
        // back edge; the other CTAs on the SM fill the tensor pipe in the gap.
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            // decode sub-tile u: my rows r0 = 16*warp + g and r0 + 8 of it
            const int r0 = u * kSubTile + 16 * warp + g;
            u32 raw0[kWords], sc0[kWords], raw1[kWords], sc1[kWords];
            read_row<kDim, kScaleMul>(st, r0, c, raw0, sc0);
            read_row<kDim, kScaleMul>(st, r0 + 8, c, raw1, sc1);
#pragma unroll
            for (int wd = 0; wd < kWords; ++wd) {
                u32 d0[4], d1[4];
                if constexpr (kCvtDecode) {
                    e2m1x8_to_f16x2_cvt(raw0[wd], d0);
                    e2m1x8_to_f16x2_cvt(raw1[wd], d1);
                } else {
                    e2m1x8_to_f16x2(raw0[wd], d0);
                    e2m1x8_to_f16x2(raw1[wd], d1);
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    d0[i] = hmul2(d0[i], sc0[wd]);
                    d1[i] = hmul2(d1[i], sc1[wd]);
                }
                // k-step 2wd: (lo nibbles, hi nibbles) of bytes 0-1; k-step 2wd+1: bytes 2-3
                a_frag[u][2 * wd][0] = d0[0]; a_frag[u][2 * wd][1] = d1[0];
                a_frag[u][2 * wd][2] = d0[1]; a_frag[u][2 * wd][3] = d1[1];
                a_frag[u][2 * wd + 1][0] = d0[2]; a_frag[u][2 * wd + 1][1] = d1[2];
                a_frag[u][2 * wd + 1][2] = d0[3]; a_frag[u][2 * wd + 1][3] = d1[3];
            }
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < kKSteps; ++ks)
                wgmma_m64n64k16(acc[u], a_frag[u][ks], wgmma_desc(qb + 2 * ks * kLbo, kLbo, kCoreBytes), ks > 0);
            wgmma_commit();
        }
        const int r0 = 16 * warp + g;
        wgmma_wait<1>();
        fence_accumulators(acc[0]);
        epilogue(acc[0], tile_start + r0, gs[r0], gs[r0 + 8]);
        wgmma_wait<0>();
        fence_accumulators(acc[1]);
        epilogue(acc[1], tile_start + kSubTile + r0, gs[kSubTile + r0], gs[kSubTile + r0 + 8]);
    }
    cp_async_wait<0>();
    __syncthreads();
    flush_histogram(hist_s, hist + (long long)t * kHistBins, tid, kThreads);
}
