// pipe_overlap.cu: which CUDA-core instruction classes slow the tensor cores' MMAs down when
// they run beside them (and which the MMAs slow down), one class at a time.
//
// Two warpgroups a CTA, two CTAs an SM (as probe_wgmma.cu's mode 2): warpgroup 0 issues the
// scoring kernels' MMA shape (wgmma.m64n64k16, fp16 A from registers or, kSS, from shared
// memory, B from shared memory, fp32 accumulators; two 64-entry sub-tiles a round, at most one
// commit group left in flight), warpgroup 1 a loop of one instruction class on 16 independent
// register chains (asm volatile: nothing folds). kRoles: 1 MMA only, 2 the class only, 3 both.
// clk[8 * cta + 0 / 1]: the MMA / class role's SM cycles from its first round to its last
// (thread 0 of its warpgroup), clk[8 * cta + 2 / 3]: the same span in nanoseconds (global
// timer), for the clock the work ran at; clk[8 * cta + 4 / 5]: the span's start (global
// timer), clk[8 * cta + 6]: the SM the CTA ran on, so that the host can check that an SM's
// two CTAs ran at the same time (the first H100 run printed an MMA rate above the board's
// peak, which two CTAs an SM one after the other would explain).
#include "../kernels/wgmma_common.cuh"

template <int kClass>
__device__ __forceinline__ void class_round(u32 (&r)[16], float (&f)[16], u32 lds_base) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        if constexpr (kClass == 0) {  // FFMA (FMA pipe)
            asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(f[i]) : "f"(0.999f), "f"(0.25f));
        } else if constexpr (kClass == 1) {  // LOP3 (ALU pipe)
            asm volatile("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(r[i]) : "r"(r[(i + 1) & 15]), "r"(0x9e3779b9u));
        } else if constexpr (kClass == 2) {  // F2FP: the E4M3 pair conversion of the decode
            asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %0; cvt.rn.f16x2.e4m3x2 %0, lo;}" : "+r"(r[i]));
        } else if constexpr (kClass == 3) {  // HFMA2 (fp16 pairs)
            asm volatile("fma.rn.f16x2 %0, %0, %1, %2;" : "+r"(r[i]) : "r"(0x3bff3bffu), "r"(0x34003400u));
        } else if constexpr (kClass == 4) {  // IMAD
            asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(r[i]) : "r"(0x01000193u), "r"(0x1234567u));
        } else if constexpr (kClass == 5) {  // SHF (funnel shift)
            asm volatile("shf.l.wrap.b32 %0, %0, %0, 5;" : "+r"(r[i]));
        } else if constexpr (kClass == 6) {  // FMNMX
            asm volatile("max.f32 %0, %0, %1;" : "+f"(f[i]) : "f"(f[(i + 5) & 15]));
        } else if constexpr (kClass == 7) {  // 16-byte shared loads (the port wgmma reads B through)
            if (i % 4 == 0)
                // volatile in PTX too: ptxas drops a plain load whose registers the next round
                // overwrites unread (the first run read 303 lanes a cycle, 38 times the port's 128 bytes)
                asm volatile("ld.volatile.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(r[i]), "=r"(r[i + 1]), "=r"(r[i + 2]), "=r"(r[i + 3])
                             : "r"(lds_base + 16u * (u32)(i / 4) * 128u));
        } else if constexpr (kClass == 8) {  // FADD with an absolute value (the epilogue's ReLU)
            asm volatile("{.reg .f32 t; abs.f32 t, %1; add.f32 %0, %0, t;}" : "+f"(f[i]) : "f"(f[(i + 3) & 15]));
        } else if constexpr (kClass == 9) {  // the decode: a code word's 4 conversions, logic and multiplies
            if (i % 4 == 0) {
                u32 d[4];
                e2m1x8_to_f16x2_cvt(r[i], d);
#pragma unroll
                for (int j = 0; j < 4; ++j) r[i + j] = hmul2(d[j], 0x3c013c01u);
            }
        } else if constexpr (kClass == 10) {  // the single-query epilogue's pair, v64's form: x + |x|, then w FMA
            asm volatile("{.reg .f32 t; abs.f32 t, %1; add.f32 t, t, %1; fma.rn.f32 %0, t, %2, %0;}"
                         : "+f"(f[i]) : "f"(f[(i + 3) & 15]), "f"(-0.5f));
        } else if constexpr (kClass == 11) {  // the pair's earlier form: ReLU by max (ALU pipe), then w FMA
            asm volatile("{.reg .f32 t; max.NaN.f32 t, %1, 0f00000000; fma.rn.f32 %0, t, %2, %0;}"
                         : "+f"(f[i]) : "f"(f[(i + 3) & 15]), "f"(-0.5f));
        }
    }
}

template <int kClass, int kRoles, bool kSS>
__global__ void __launch_bounds__(256, 2)
pipe_overlap_kernel(const u32* __restrict__ a_frag, const uint4* __restrict__ b, int mma_rounds, int class_rounds,
                    float* __restrict__ out, long long* __restrict__ clk)
{
    using namespace score_wgmma;
    constexpr int kDim = 128, kKSteps = kDim / 16;
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x & 127, role = threadIdx.x >> 7;  // 0: MMA, 1: the class
    for (int i = threadIdx.x; i < (kDim / 8) * kLbo / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = b[i];
    fence_proxy_async();
    __syncthreads();
    const u64 desc = wgmma_desc(smem, kLbo, kCoreBytes);
    long long c0 = 0, n0 = 0;
    auto stamp_start = [&]() {
        if (tid == 0) {
            c0 = clock64();
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(n0));
        }
    };
    auto stamp_end = [&]() {
        if (tid == 0) {
            long long n1;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(n1));
            u32 sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            clk[8 * blockIdx.x + role] = clock64() - c0;
            clk[8 * blockIdx.x + 2 + role] = n1 - n0;
            clk[8 * blockIdx.x + 4 + role] = n0;
            clk[8 * blockIdx.x + 6] = sm;
        }
    };
    float s = 0.0f;
    if (role == 0 && (kRoles & 1)) {
        u32 a[kKSteps][4];
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
            for (int q = 0; q < 4; ++q) a[ks][q] = a_frag[(ks * 4 + q) * 128 + tid];
        float acc[2][32];
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int i = 0; i < 32; ++i) acc[u][i] = 0.0f;
        stamp_start();
        for (int it = 0; it < mma_rounds; ++it) {
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < kKSteps; ++ks) {
                    const u64 d = desc + (u64)((2 * ks * kLbo) >> 4);
                    if constexpr (kSS)
                        wgmma_m64n64k16_ss(acc[u], d, d, 1);
                    else
                        wgmma_m64n64k16(acc[u], a[ks], d, 1);
                }
                wgmma_commit();
            }
            wgmma_wait<1>();
        }
        wgmma_wait<0>();
        fence_accumulators(acc[0]);
        fence_accumulators(acc[1]);
        stamp_end();
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int i = 0; i < 32; ++i) s += acc[u][i];
    } else if (role == 1 && (kRoles & 2)) {
        u32 r[16];
        float f[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            r[i] = a_frag[i * 128 + tid] ^ (0x01010101u * (u32)i);
            f[i] = 0.5f + 0.01f * (float)(i + tid);
        }
        const u32 lds_base = smem_u32(smem) + 16u * (u32)tid;
        stamp_start();
        for (int it = 0; it < class_rounds; ++it) class_round<kClass>(r, f, lds_base);
        stamp_end();
#pragma unroll
        for (int i = 0; i < 16; ++i) s += f[i] + __uint_as_float(r[i] & 0x3fffffffu);
    }
    out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = s;
}
