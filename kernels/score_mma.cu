// score_mma.cu: the fast scoring path on tensor cores (mma.sync m16n8k16, fp16 in, fp32 out).
//
// Scores as score_fp32.cu does, to the same float32 workspace, with the dot products on
// tensor cores:
//   * A operand = keys, 16 entries x 16 dims per MMA, decoded from NVFP4 straight into the
//     A-fragment registers: no shared-memory round trip. Each thread loads D/8 contiguous
//     bytes of each of its rows; the MMA's K index is a fixed permutation of d chosen so
//     that those bytes are exactly the thread's fragment elements (the query is laid out
//     with the same permutation, so the dot product is unchanged).
//   * Element decode: an E2M1 nibble placed into fp16 bits (sign -> bit 15, magnitude ->
//     bits 9..11) is the value times 2^-14 exactly (code 1 becomes an fp16 subnormal); one
//     fp16 multiply by (E4M3 scale * 2^6) gives e2m1 * scale * 2^-8, exact in fp16 for every
//     code and scale (at most 6 significant bits, lowest bit >= 2^-23).
//   * B operand = the query: per head, a power of two brings max |q| into [2^14, 2^15)
//     before rounding to fp16 (so the rounding error is 2^-11 relative); 2^8 and that power
//     of two are folded back into the head weight in float32.
//   * Epilogue: ReLU that keeps NaN (max.NaN), weighted head sum, quad shuffles, the block's
//     global scale; scores written to the workspace.
#include "common.cuh"

namespace score_mma {
constexpr int kWarps = 4;
constexpr int kMBlocks = 2;                        // 16-entry row blocks per warp and pass
constexpr int kPassEntries = 16 * kMBlocks;        // entries per warp pass
constexpr int kTileEntries = kWarps * kPassEntries;  // entries per CTA iteration (128)
}  // namespace score_mma

__device__ __forceinline__ float max_keep_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

__device__ __forceinline__ void mma_16816(float* d, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(u32* r, const void* smem_ptr) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem_ptr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// Eight E2M1 codes (one 32-bit word, bytes B0..B3) -> four fp16x2 registers, each value
// times 2^-14:  out[0] = (lo B0, lo B1), out[1] = (hi B0, hi B1),
//               out[2] = (lo B2, lo B3), out[3] = (hi B2, hi B3).
__device__ __forceinline__ void e2m1x8_to_f16x2(u32 x, u32* out) {
    const u32 r0 = prmt(x, 0u, 0x1404u);  // B0 -> bits 8..15, B1 -> bits 24..31
    const u32 r1 = prmt(x, 0u, 0x3424u);  // B2, B3 likewise
    // low nibble: sign (lane bit 11) -> 15, magnitude (bits 8..10) -> 9..11
    out[0] = ((r0 << 4) & 0x80008000u) | ((r0 << 1) & 0x0e000e00u);
    out[2] = ((r1 << 4) & 0x80008000u) | ((r1 << 1) & 0x0e000e00u);
    // high nibble: sign already at 15, magnitude (bits 12..14) -> 9..11
    out[1] = (r0 & 0x80008000u) | ((r0 >> 3) & 0x0e000e00u);
    out[3] = (r1 & 0x80008000u) | ((r1 >> 3) & 0x0e000e00u);
}

// fp16x2 holding (scale * 2^6, scale * 2^6) for an E4M3 byte; NaN bytes give NaN.
__device__ __forceinline__ u32 scale_to_f16x2(u32 byte) {
    const float s = e4m3_to_float(byte) * 64.0f;  // <= 28672 and exact in fp16
    u32 h;
    asm("{ .reg .f16 t; cvt.rn.f16.f32 t, %1; mov.b32 %0, {t, t}; }" : "=r"(h) : "f"(s));
    return h;
}

// kDim: head dim (multiple of 32). kNBlocks: 8-head column blocks (even; heads padded).
template <int kDim, int kNBlocks>
__global__ void __launch_bounds__(score_mma::kWarps * 32)
score_mma_kernel(const float* __restrict__ q,            // [T, H, D]
                 const float* __restrict__ w,            // [T, H]
                 const u8* __restrict__ keys_fp4,        // [P, E, D/2]
                 const u8* __restrict__ key_scale,       // [P, E, D/16]
                 const float* __restrict__ key_gscale,   // [P]
                 const int* __restrict__ block_table,    // [T, L]
                 const int* __restrict__ valid_lens,     // [T]
                 int H, int P, int E, int L,
                 int tiles_per_cta,
                 float* __restrict__ scores,             // [T, ld] workspace
                 long long ld)
{
    using namespace score_mma;
    static_assert(kDim % 32 == 0 && kDim >= 32 && kDim <= 256, "D must be a multiple of 32 in [32, 256]");
    static_assert(kNBlocks % 2 == 0 && kNBlocks >= 2 && kNBlocks <= 16, "heads padded to 16..128");
    constexpr int kHeads = 8 * kNBlocks;
    constexpr int kWords = kDim / 32;        // 32-bit words of codes per thread and row
    constexpr int kRowHalves = kDim + 8;     // padded smem row of the query: conflict-free ldmatrix

    __shared__ __align__(16) unsigned short qs[kHeads * kRowHalves];  // fp16 query, permuted K
    __shared__ float wsm[kHeads];                                    // weight * 2^(8 - e_h)

    const int t = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n = valid_lens[t];
    n = n < 0 ? 0 : (n > L * E ? L * E : n);
    const int first_tile = blockIdx.y * tiles_per_cta;
    if (first_tile * kTileEntries >= n) return;  // uniform: past the row's end
    const int last_tile = min(first_tile + tiles_per_cta, (n + kTileEntries - 1) / kTileEntries);

    // ---- stage the query: per-head power-of-two scale, fp16, K permuted to match the decode
    // K slot kk of k-step s = 2*wd + hh holds d = c*D/4 + 8*wd + 4*hh + 2*j + lohi, where
    // c = (kk % 8) / 2, j = kk % 2, lohi = kk / 8.
    const float* qt = q + (long long)t * H * kDim;
    for (int h = warp; h < kHeads; h += kWarps) {
        float amax = 0.0f;
        if (h < H)
            for (int d = lane; d < kDim; d += 32) amax = fmaxf(amax, fabsf(qt[h * kDim + d]));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, off));
        int e = 0;
        if (amax > 0.0f && amax <= 3.402823466e38f) {
            int ex;
            frexpf(amax, &ex);  // amax in [2^(ex-1), 2^ex)
            e = 15 - ex;
        }
        for (int i = lane; i < kDim; i += 32) {
            const int s = i / 16, kk = i % 16;
            const int wd = s / 2, hh = s % 2, c = (kk % 8) / 2, j = kk % 2, lohi = kk / 8;
            const int d = c * (kDim / 4) + 8 * wd + 4 * hh + 2 * j + lohi;
            const float v = h < H ? ldexpf(qt[h * kDim + d], e) : 0.0f;
            unsigned short hx;
            asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hx) : "f"(v));
            qs[h * kRowHalves + i] = hx;
        }
        if (lane == 0) wsm[h] = h < H ? ldexpf(w[(long long)t * H + h], 8 - e) : 0.0f;
    }
    __syncthreads();

    const int g = lane >> 2, c = lane & 3;
    // my weights: heads 8j + 2c + {0, 1}
    float wreg[kNBlocks][2];
#pragma unroll
    for (int j = 0; j < kNBlocks; ++j) {
        wreg[j][0] = wsm[8 * j + 2 * c];
        wreg[j][1] = wsm[8 * j + 2 * c + 1];
    }
    // ldmatrix row address of this thread: matrix mi = lane / 8, row lane % 8
    const int mi = lane >> 3;
    const unsigned short* qrow = qs + (8 * (mi >> 1) + (lane & 7)) * kRowHalves + (mi & 1) * 8;

    const int half_d = kDim / 2, groups = kDim / 16;
    const int* bt = block_table + (long long)t * L;

    for (int tile = first_tile; tile < last_tile; ++tile) {
        const int base = tile * kTileEntries + warp * kPassEntries;
        // ---- my 4 rows: entries base + mb*16 + g (+8); load codes, scales and global scale
        u32 raw[2 * kMBlocks][kWords];
        u32 sc[2 * kMBlocks][kWords];  // fp16x2 scale * 2^6 of each word's 16-element group
        float gsc[2 * kMBlocks];
#pragma unroll
        for (int r = 0; r < 2 * kMBlocks; ++r) {
            const int s = base + (r >> 1) * 16 + g + (r & 1) * 8;
            long long ent = -1;
            gsc[r] = __int_as_float(0x7fc00000);
            if (s < n) {
                const int b = bt[s / E];
                if (b >= 0 && b < P) {
                    ent = (long long)b * E + s % E;
                    gsc[r] = key_gscale[b];
                }
            }
            if (ent >= 0) {
                const u8* src = keys_fp4 + ent * half_d + c * (kDim / 8);
                if constexpr (kWords % 4 == 0) {
#pragma unroll
                    for (int v = 0; v < kWords / 4; ++v) {
                        const uint4 x = reinterpret_cast<const uint4*>(src)[v];
                        raw[r][4 * v] = x.x; raw[r][4 * v + 1] = x.y; raw[r][4 * v + 2] = x.z; raw[r][4 * v + 3] = x.w;
                    }
                } else if constexpr (kWords % 2 == 0) {
#pragma unroll
                    for (int v = 0; v < kWords / 2; ++v) {
                        const uint2 x = reinterpret_cast<const uint2*>(src)[v];
                        raw[r][2 * v] = x.x; raw[r][2 * v + 1] = x.y;
                    }
                } else {
#pragma unroll
                    for (int v = 0; v < kWords; ++v) raw[r][v] = reinterpret_cast<const u32*>(src)[v];
                }
                // word wd covers elements c*D/4 + 8*wd .. +7: scale group (c*D/4 + 8*wd) / 16;
                // when D is a multiple of 64, words 2m and 2m+1 share their group
                const u8* srow = key_scale + ent * groups;
#pragma unroll
                for (int wd = 0; wd < kWords; ++wd)
                    sc[r][wd] = (kDim % 64 == 0 && (wd & 1)) ? sc[r][wd - 1]
                                                             : scale_to_f16x2(srow[(c * (kDim / 4) + 8 * wd) / 16]);
            } else {
#pragma unroll
                for (int v = 0; v < kWords; ++v) raw[r][v] = 0u;
#pragma unroll
                for (int v = 0; v < kWords; ++v) sc[r][v] = 0u;
            }
        }

        float acc[kMBlocks][kNBlocks][4];
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
            for (int j = 0; j < kNBlocks; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[mb][j][i] = 0.0f;

#pragma unroll
        for (int wd = 0; wd < kWords; ++wd) {
            // decode word wd of each row: two k-steps of A fragments
            u32 dec[2 * kMBlocks][4];
#pragma unroll
            for (int r = 0; r < 2 * kMBlocks; ++r) {
                e2m1x8_to_f16x2(raw[r][wd], dec[r]);
                const u32 s2 = sc[r][wd];
#pragma unroll
                for (int i = 0; i < 4; ++i) dec[r][i] = hmul2(dec[r][i], s2);
            }
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int s = 2 * wd + hh;
#pragma unroll
                for (int jp = 0; jp < kNBlocks; jp += 2) {
                    u32 b[4];
                    ldmatrix_x4(b, qrow + jp * 8 * kRowHalves + s * 16);
#pragma unroll
                    for (int mb = 0; mb < kMBlocks; ++mb) {
                        const u32 a[4] = {dec[2 * mb][2 * hh], dec[2 * mb + 1][2 * hh],
                                          dec[2 * mb][2 * hh + 1], dec[2 * mb + 1][2 * hh + 1]};
                        mma_16816(acc[mb][jp], a, b[0], b[1]);
                        mma_16816(acc[mb][jp + 1], a, b[2], b[3]);
                    }
                }
            }
        }

        // ---- epilogue: rows g (acc[..][0..1]) and g + 8 (acc[..][2..3]) of each m-block
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
            float lo = 0.0f, hi = 0.0f;
#pragma unroll
            for (int j = 0; j < kNBlocks; ++j) {
                lo = fmaf(wreg[j][0], max_keep_nan(acc[mb][j][0], 0.0f), lo);
                lo = fmaf(wreg[j][1], max_keep_nan(acc[mb][j][1], 0.0f), lo);
                hi = fmaf(wreg[j][0], max_keep_nan(acc[mb][j][2], 0.0f), hi);
                hi = fmaf(wreg[j][1], max_keep_nan(acc[mb][j][3], 0.0f), hi);
            }
            lo += __shfl_xor_sync(FULL_MASK, lo, 1);
            hi += __shfl_xor_sync(FULL_MASK, hi, 1);
            lo += __shfl_xor_sync(FULL_MASK, lo, 2);
            hi += __shfl_xor_sync(FULL_MASK, hi, 2);
            const int s_lo = base + mb * 16 + g;
            float* out = scores + (long long)t * ld;
            if (c == 0) out[s_lo] = lo * gsc[2 * mb] + 0.0f;
            if (c == 1) out[s_lo + 8] = hi * gsc[2 * mb + 1] + 0.0f;
        }
    }
}
