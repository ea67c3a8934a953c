// probe_wgmma.cu: the tensor-core rate of the one MMA shape the fp16 scoring kernels issue
// (wgmma.m64n64k16, fp16 A from registers, B from shared memory, fp32 accumulators), with
// nothing else in the loop. scripts/probe_ceiling.py sets it beside a large GEMM's rate
// (bench's ceiling): the first says how fast the scoring kernels' MMAs can go at all, the
// second is what the floor is measured against.
#include "wgmma_common.cuh"

// B, copied into shared memory through the generic proxy, published to wgmma (after every
// thread's copies): its descriptor
__device__ __forceinline__ u64 publish_b(unsigned char* smem) {
    fence_proxy_async();
    __syncthreads();
    return wgmma_desc(smem, score_wgmma::kLbo, score_wgmma::kCoreBytes);
}

// The probes' register-only epilogue: ReLU keeping NaN and the head weight's FMA for each of
// a sub-tile's 32 accumulators, into four running sums (weighted_head_sum_mine's arithmetic
// without its shuffles).
__device__ __forceinline__ void relu_fma_sums(const float (&d)[32], const float2 (&wt)[8], float (&e)[4]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        e[0] = fmaf(wt[j].x, relu_nan(d[4 * j]), e[0]);
        e[1] = fmaf(wt[j].y, relu_nan(d[4 * j + 1]), e[1]);
        e[2] = fmaf(wt[j].x, relu_nan(d[4 * j + 2]), e[2]);
        e[3] = fmaf(wt[j].y, relu_nan(d[4 * j + 3]), e[3]);
    }
}

__device__ __forceinline__ void zero_accumulators(float (&acc)[2][32]) {
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[u][i] = 0.0f;
}

// grid (G,), 128 threads (one warpgroup), (kDim / 8) * kLbo bytes of dynamic shared memory
// (B: 64 heads x kDim in the scoring kernels' core-matrix layout, copied from b). Each of
// `rounds` rounds issues what one 128-entry tile costs the single-warpgroup kernel: two
// 64-entry sub-tiles of kDim / 16 k-steps, one commit group each, at most one group left in
// flight. a: the A fragments, [kDim / 16][4][128] u32 (fp16 pairs). out[blockIdx.x * 128 +
// thread]: a sum of the accumulators, so that nothing is optimized away.
template <int kDim>
__global__ void __launch_bounds__(128) wgmma_rate_kernel(const u32* __restrict__ a_frag, const uint4* __restrict__ b,
                                                         int rounds, float* __restrict__ out)
{
    using namespace score_wgmma;
    constexpr int kKSteps = kDim / 16;
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x;
    for (int i = tid; i < (kDim / 8) * kLbo / 16; i += 128) reinterpret_cast<uint4*>(smem)[i] = b[i];
    u32 a[kKSteps][4];
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[ks][r] = a_frag[(ks * 4 + r) * 128 + tid];
    const u64 desc = publish_b(smem);
    float acc[2][32];
    zero_accumulators(acc);
    for (int it = 0; it < rounds; ++it) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < kKSteps; ++ks)
                wgmma_m64n64k16(acc[u], a[ks], desc + (u64)((2 * ks * kLbo) >> 4), 1);
            wgmma_commit();
        }
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    fence_accumulators(acc[0]);
    fence_accumulators(acc[1]);
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int i = 0; i < 32; ++i) s += acc[u][i];
    out[(long long)blockIdx.x * 128 + tid] = s;
}

// ---------------------------------------------------------------------------
// Do the tensor cores and the CUDA cores overlap? The same per-tile work as the
// single-warpgroup scoring kernel, in parts, with every load, store and address taken out.
// One round = one 128-entry tile's share of one thread:
//   * MMA: two sub-tiles of kDim / 16 wgmma.m64n64k16 (A in registers, B in shared memory);
//   * ALU: the decode of 16 code words (e2m1x8_to_f16x2_cvt and the scale's fp16 multiplies:
//     the kernel's decode_sub_tile without its shared-memory reads) and the epilogue of 64
//     accumulators (ReLU keeping NaN and the head weight's FMA: weighted_head_sum_mine without
//     its shuffles).
// kMode 0: MMA only; 1: ALU only; 2: one warpgroup of each per CTA (256 threads: warpgroup 0
// MMA, warpgroup 1 ALU, independent); 3: one warpgroup doing both in the kernel's order
// (decode sub-tile u into its A fragments, its MMAs, then the epilogues on the accumulators);
// 4 and 5: modes 0 and 2 with A from shared memory too (wgmma's SS form, as score_ws.cu);
// 6: mode 3 without the decode (the keys-stationary loop order: a CTA's key fragments
// decoded once and kept, each round one more query's MMAs and epilogues against them).
// clk[2 * blockIdx.x]: SM clocks from the first round to the last, clk[2 * blockIdx.x + 1]:
// nanoseconds (the global timer) over the same span, for the clock rate the work ran at.
// Each round decodes words taken from the last round's output, and the ALU-only epilogue
// reads the decoded registers, so that nothing folds. a_frag, b, out as for wgmma_rate_kernel; out has one float per thread.
template <int kMode>
__global__ void __launch_bounds__(kMode == 2 || kMode == 5 ? 256 : 128, kMode == 2 || kMode == 5 ? 2 : 3)
wgmma_overlap_kernel(const u32* __restrict__ a_frag, const uint4* __restrict__ b, int rounds,
                     float* __restrict__ out, long long* __restrict__ clk)
{
    using namespace score_wgmma;
    constexpr int kDim = 128, kKSteps = kDim / 16;
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x & 127;
    constexpr bool kSplit = kMode == 2 || kMode == 5, kSS = kMode == 4 || kMode == 5;
    const bool mma_role = kMode == 0 || kMode == 3 || kMode == 4 || (kSplit && threadIdx.x < 128);
    const bool alu_role = kMode == 1 || kMode == 3 || (kSplit && threadIdx.x >= 128);
    for (int i = threadIdx.x; i < (kDim / 8) * kLbo / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = b[i];
    u32 a[2][kKSteps][4];
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[0][ks][r] = a[1][ks][r] = a_frag[(ks * 4 + r) * 128 + tid];
    const u64 desc = publish_b(smem);
    float acc[2][32];
    zero_accumulators(acc);
    float2 wt[8];  // head weights: any finite values
#pragma unroll
    for (int j = 0; j < 8; ++j) wt[j] = make_float2(__uint_as_float(a[0][j][0] & 0xbfffffffu), __uint_as_float(a[0][j][1] & 0xbfffffffu));
    u32 raw[2][kKSteps];  // sub-tile u's code words: 4 of row r0, then 4 of row r0 + 8
#pragma unroll
    for (int i = 0; i < kKSteps; ++i) {  // different words per sub-tile: nothing to share
        raw[0][i] = a[0][i][0] ^ a[0][(i + 1) % kKSteps][1];
        raw[1][i] = a[0][i][2] ^ a[0][(i + 1) % kKSteps][3];
    }
    const u32 sc = 0x3c003c00u ^ (tid & 1);
    float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    // the decode of sub-tile u's 8 words into its A fragments (the kernel's order); the next
    // round decodes words taken from these fragments, so ptxas (which sees no empty asm) can
    // fold nothing
    auto decode = [&](int u) {
#pragma unroll
        for (int wd = 0; wd < kKSteps; ++wd) {
            const int row = wd / 4, k0 = 2 * (wd % 4);  // word wd: k-steps k0, k0 + 1 of one row
            u32 d[4];
            e2m1x8_to_f16x2_cvt(raw[u][wd], d);
#pragma unroll
            for (int i = 0; i < 4; ++i) a[u][k0 + i / 2][2 * (i % 2) + row] = hmul2(d[i], sc);
            raw[u][wd] = a[u][k0][row];
        }
    };
    auto epilogue = [&](const float (&d)[32]) { relu_fma_sums(d, wt, e); };
    // sub-tile u's MMAs from its own fragments (modes 3, 6) or from sub-tile 0's (the MMA role:
    // half the registers, as in wgmma_rate_kernel)
    auto mma = [&](int u) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
            const u64 d = desc + (u64)((2 * ks * kLbo) >> 4);
            if (kSS)
                wgmma_m64n64k16_ss(acc[u], d, d, 1);  // A: B's 64 rows, same layout
            else
                wgmma_m64n64k16(acc[u], a[kMode == 3 || kMode == 6 ? u : 0][ks], d, 1);
        }
        wgmma_commit();
    };

    long long clk0 = 0, ns0 = 0;
    if (threadIdx.x == 0) {
        clk0 = clock64();
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns0));
    }
    // one loop per role, so that ptxas sees no accumulator read beside an MMA in flight;
    // every group is waited for inside its round, as in the scoring kernel
    if (kMode == 3 || kMode == 6) {
        for (int it = 0; it < rounds; ++it) {
            if (kMode == 3) decode(0);
            mma(0);
            if (kMode == 3) decode(1);
            mma(1);
            wgmma_wait<1>();
            fence_accumulators(acc[0]);
            epilogue(acc[0]);
            wgmma_wait<0>();
            fence_accumulators(acc[1]);
            epilogue(acc[1]);
        }
    } else if (mma_role) {
        for (int it = 0; it < rounds; ++it) {
            mma(0);
            mma(1);
            wgmma_wait<0>();
        }
    } else if (alu_role) {
        for (int it = 0; it < rounds; ++it) {
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                decode(u);
                float v[32];  // the decoded fp16 pairs' bits as the epilogue's inputs
#pragma unroll
                for (int i = 0; i < 32; ++i) v[i] = __uint_as_float(a[u][i / 4][i % 4]);
                epilogue(v);
            }
        }
    }
    wgmma_wait<0>();
    fence_accumulators(acc[0]);
    fence_accumulators(acc[1]);
    float s = e[0] + e[1] + e[2] + e[3];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int i = 0; i < 32; ++i) s += acc[u][i];
    out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) {
        long long ns1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns1));
        clk[2 * blockIdx.x] = clock64() - clk0;
        clk[2 * blockIdx.x + 1] = ns1 - ns0;
    }
}

// ---------------------------------------------------------------------------
// The scoring kernel's tile loop rebuilt in steps from the arithmetic core above, to
// attribute its time per tile (one 128-entry tile a round, 3 CTAs of 128 threads per SM):
//   kStep 1: the codes and scales read from a shared-memory stage (decode_sub_tile, as the
//            kernel reads its ring) instead of registers; MMAs; the register-only epilogue;
//   kStep 2: step 1 with the kernel's epilogue (weights from shared memory, the quad's
//            shuffles, the global scale from shared memory, the score stored to global
//            memory, its key counted into a shared-memory histogram).
// What the real kernel adds beyond step 2 is its key stream: the ring's mbarrier wait and
// barrier, the bulk copies' issue, block-id and global-scale prefetch, and addresses.
//   kStep 3: the keys-stationary loop order at step 2's cost: the two sub-tiles decoded
//            once before the loop and kept; each round one more query (B alternating
//            between two places, as a ring of query tiles would), a CTA barrier a round
//            (the ring's wait), its MMAs and step 2's epilogue.
// Shared memory: B (16 KB, from b), one stage (wgmma_stage_bytes(128), from b's first
// bytes), 64 weights and 128 global scales, a 2,048-bin histogram: kTileSmemBytes.
// out: [gridDim.x][64 tiles][128] scores (a ring of 64 tiles a CTA); clk as above.
constexpr int kTileStage = 16 * 1024, kTileW = kTileStage + wgmma_stage_bytes(128), kTileGs = kTileW + 64 * 4,
              kTileHist = kTileGs + 128 * 4, kTileSmemBytes = kTileHist + 2048 * 4;

template <int kStep>
__global__ void __launch_bounds__(128, 3)
wgmma_tile_kernel(const uint4* __restrict__ b, int rounds, float* __restrict__ out, long long* __restrict__ clk)
{
    using namespace score_wgmma;
    constexpr int kDim = 128, kKSteps = kDim / 16;
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    for (int i = tid; i < kTileW / 16; i += 128) reinterpret_cast<uint4*>(smem)[i] = b[i % ((kDim / 8) * kLbo / 16)];
    float* wsm = reinterpret_cast<float*>(smem + kTileW);
    float* gs = reinterpret_cast<float*>(smem + kTileGs);
    u32* hist_s = reinterpret_cast<u32*>(smem + kTileHist);
    if (tid < 64) wsm[tid] = 1.0f + 0.01f * tid;
    gs[tid] = 0.5f + 0.001f * tid;
    for (int i = tid; i < 2048; i += 128) hist_s[i] = 0u;
    fence_proxy_async();
    __syncthreads();
    const u64 desc = wgmma_desc(smem, kLbo, kCoreBytes);
    u32 a[2][kKSteps][4];
    float acc[2][32];
    float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float2 wt[8];  // the register-only epilogue's weights
#pragma unroll
    for (int j = 0; j < 8; ++j) wt[j] = make_float2(1.0f + j, 2.0f - j);
    const int r0 = 16 * warp + g;
    float* dst = out + (long long)blockIdx.x * 64 * 128;
    auto epilogue = [&](const float (&d)[32], int s0, float g0, float g1) {
        if (kStep == 1) {
            relu_fma_sums(d, wt, e);
        } else {  // score_segment's epilogue
            const float mine = weighted_head_sum_mine(d, wsm, c);
            if (c < 2) {
                const int s = s0 + 8 * c;
                const float score = mine * (c ? g1 : g0) + 0.0f;
                dst[s] = score;
                const u32 key = score_to_key(score);
                if (key) atomicAdd(&hist_s[key >> 21], 1u);
            }
        }
    };

    long long clk0 = 0, ns0 = 0;
    if (tid == 0) {
        clk0 = clock64();
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns0));
    }
    if (kStep == 3) {  // the key fragments, decoded once
#pragma unroll
        for (int u = 0; u < 2; ++u) decode_sub_tile<kDim>(smem + kTileStage, u * kSubTile + r0, c, a[u]);
    }
    for (int it = 0; it < rounds; ++it) {
        const int tile = (it % 64) * 128;
        if (kStep == 3) {
            __syncthreads();  // the query ring's wait, as a real loop would have
            const u64 dq = desc + (u64)(((it & 1) * 8192) >> 4);  // this round's query
#pragma unroll
            for (int u = 0; u < 2; ++u) mma_sub_tile<kDim>(acc[u], a[u], dq);
        } else {
            // odd rounds read their stage 8 KB lower (into B's bytes): a stage address that
            // moves, as the ring's does, so that ptxas cannot hoist the reads out of the loop
            const unsigned char* st = smem + kTileStage - (it & 1) * 8192;
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                decode_sub_tile<kDim>(st, u * kSubTile + r0, c, a[u]);
                mma_sub_tile<kDim>(acc[u], a[u], desc);
            }
        }
        const float ga0 = gs[r0], ga1 = gs[r0 + 8], gb0 = gs[kSubTile + r0], gb1 = gs[kSubTile + r0 + 8];
        wgmma_wait<1>();
        fence_accumulators(acc[0]);
        epilogue(acc[0], tile + r0, ga0, ga1);
        wgmma_wait<0>();
        fence_accumulators(acc[1]);
        epilogue(acc[1], tile + kSubTile + r0, gb0, gb1);
    }
    __syncthreads();
    float s = e[0] + e[1] + e[2] + e[3] + (float)hist_s[tid];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int i = 0; i < 32; ++i) s += acc[u][i];
    if (kStep == 1) dst[tid] = s;
    if (tid == 0) {
        long long ns1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns1));
        clk[2 * blockIdx.x] = clock64() - clk0;
        clk[2 * blockIdx.x + 1] = ns1 - ns0;
    }
}
