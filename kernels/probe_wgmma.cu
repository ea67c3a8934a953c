// probe_wgmma.cu: the tensor-core rate of the one MMA shape the fp16 scoring kernels issue
// (wgmma.m64n64k16, fp16 A from registers, B from shared memory, fp32 accumulators), with
// nothing else in the loop. scripts/probe_ceiling.py sets it beside a large GEMM's rate
// (bench's ceiling): the first says how fast the scoring kernels' MMAs can go at all, the
// second is what the floor is measured against.
#include "wgmma_common.cuh"

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
    fence_proxy_async();  // B, written through the generic proxy, is read by wgmma
    __syncthreads();
    const u64 desc = wgmma_desc(smem, kLbo, kCoreBytes);
    float acc[2][32];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[u][i] = 0.0f;
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
