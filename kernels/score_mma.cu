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
//   * Keys stream through a ring of kStages shared-memory tiles filled with cp.async (zero
//     fill for entries past the row's end or behind an out-of-range block id), so global
//     latency hides behind the tensor work of earlier tiles.
//   * Epilogue: ReLU that keeps NaN (max.NaN), weighted head sum, quad shuffles, the block's
//     global scale; scores written to the workspace, and the top 11 bits of each score's
//     order key counted into a per-row histogram (the first pass of the radix select).
#include "common.cuh"

namespace score_mma {
constexpr int kWarps = 4;
constexpr int kMBlocks = 2;                        // 16-entry row blocks per warp and pass
constexpr int kPassEntries = 16 * kMBlocks;        // entries per warp pass
constexpr int kTileEntries = kWarps * kPassEntries;  // entries per CTA iteration (128)
constexpr int kStages = 4;                         // shared-memory ring depth
constexpr int kHistBins = 2048;                    // top 11 bits of the score key
}  // namespace score_mma

// Shared-memory bytes of one ring stage for head dim D: codes, then scales (16-byte padded).
__host__ __device__ constexpr int mma_stage_bytes(int D) {
    return score_mma::kTileEntries * (D / 2) + ((score_mma::kTileEntries * (D / 16) + 15) / 16) * 16;
}

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

// Two E4M3 bytes (low 16 bits of `pair`) -> fp16x2 (scale0 * 2^6, scale1 * 2^6), exact;
// NaN bytes give NaN. One hardware conversion and one multiply.
__device__ __forceinline__ u32 scales_to_f16x2(u32 pair) {
    u32 h;
#if __CUDA_ARCH__ >= 890
    asm("{ .reg .b16 lo; cvt.u16.u32 lo, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(h) : "r"(pair));
#else
    const float s0 = e4m3_to_float(pair & 255u), s1 = e4m3_to_float((pair >> 8) & 255u);
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(s1), "f"(s0));
#endif
    return hmul2(h, 0x54005400u);  // * (64, 64)
}

// (lo, lo) and (hi, hi) of an fp16x2
__device__ __forceinline__ u32 splat_lo(u32 v) { return prmt(v, v, 0x1010u); }
__device__ __forceinline__ u32 splat_hi(u32 v) { return prmt(v, v, 0x3232u); }

// Query staging, once per call: q[t] (H x D float32) -> fp16 [kHeads][D + 8] in the permuted
// K order of the decode, each head scaled by a power of two 2^e that brings max |q| into
// [2^14, 2^15); and w[t, h] * 2^(8 - e) (folding back that power and the 2^-8 of the keys).
// K slot kk of k-step s = 2*wd + hh holds d = c*D/4 + 8*wd + 4*hh + 2*j + lohi, where
// c = (kk % 8) / 2, j = kk % 2, lohi = kk / 8.
template <int kDim, int kNBlocks>
__global__ void __launch_bounds__(128)
prep_query_kernel(const float* __restrict__ q, const float* __restrict__ w, int H,
                  unsigned short* __restrict__ q16,  // [T, kHeads, kDim + 8]
                  float* __restrict__ w_scaled)      // [T, kHeads]
{
    constexpr int kHeads = 8 * kNBlocks, kRowHalves = kDim + 8;
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* qt = q + (long long)t * H * kDim;
    unsigned short* out = q16 + (long long)t * kHeads * kRowHalves;
    for (int h = warp; h < kHeads; h += 4) {
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
        for (int i = lane; i < kRowHalves; i += 32) {
            unsigned short hx = 0;
            if (i < kDim && h < H) {
                const int ks = i / 16, kk = i % 16;
                const int wd = ks / 2, hh = ks % 2, c = (kk % 8) / 2, j = kk % 2, lohi = kk / 8;
                const int d = c * (kDim / 4) + 8 * wd + 4 * hh + 2 * j + lohi;
                asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hx) : "f"(ldexpf(qt[h * kDim + d], e)));
            }
            out[h * kRowHalves + i] = hx;
        }
        if (lane == 0) w_scaled[(long long)t * kHeads + h] = h < H ? ldexpf(w[(long long)t * H + h], 8 - e) : 0.0f;
    }
}

// kDim: head dim (multiple of 32). kNBlocks: 8-head column blocks (even; heads padded).
template <int kDim, int kNBlocks>
__global__ void __launch_bounds__(score_mma::kWarps * 32)
score_mma_kernel(const unsigned short* __restrict__ q16,  // [T, kHeads, kDim + 8] from prep_query_kernel
                 const float* __restrict__ w_scaled,      // [T, kHeads]
                 const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                 const u8* __restrict__ key_scale,        // [P, E, D/16]
                 const float* __restrict__ key_gscale,    // [P]
                 const int* __restrict__ block_table,     // [T, L]
                 const int* __restrict__ valid_lens,      // [T]
                 int P, int E, int e_shift,               // e_shift = log2(E) when E is a power of two, else -1
                 int L, int tiles_per_cta,
                 float* __restrict__ scores,              // [T, ld] workspace
                 long long ld,
                 u32* __restrict__ hist)                  // [T, kHistBins] or nullptr
{
    using namespace score_mma;
    static_assert(kDim % 32 == 0 && kDim >= 32 && kDim <= 256, "D must be a multiple of 32 in [32, 256]");
    static_assert(kNBlocks % 2 == 0 && kNBlocks >= 2 && kNBlocks <= 16, "heads padded to 16..128");
    constexpr int kHeads = 8 * kNBlocks;
    constexpr int kWords = kDim / 32;          // 32-bit words of codes per thread and row
    constexpr int kRowHalves = kDim + 8;       // padded smem row of the query: conflict-free ldmatrix
    constexpr int kThreads = kWarps * 32;
    constexpr int kCodeBytes = kDim / 2, kScaleBytes = kDim / 16;
    constexpr int kChunksPerRow = kCodeBytes / 16;
    constexpr int kStageBytes = mma_stage_bytes(kDim);
    constexpr int kScaleOffset = kTileEntries * kCodeBytes;
    constexpr int kMetaSlots = kStages + 1;    // entry metadata runs one tile ahead of the copies
    constexpr int kQBytes = kHeads * kRowHalves * 2;
    static_assert(kThreads == kTileEntries, "one thread per entry of a tile for the metadata");
    static_assert(kQBytes % 16 == 0, "query rows copy in 16-byte chunks");

    extern __shared__ __align__(16) unsigned char smem[];
    unsigned short* qs = reinterpret_cast<unsigned short*>(smem);                   // [kHeads][kRowHalves]
    float* wsm = reinterpret_cast<float*>(smem + kQBytes);                          // [kHeads]
    unsigned char* ring = reinterpret_cast<unsigned char*>(wsm + kHeads);           // [kStages][kStageBytes]
    int* meta_ent = reinterpret_cast<int*>(ring + kStages * kStageBytes);          // [kMetaSlots][kTileEntries]
    float* meta_gs = reinterpret_cast<float*>(meta_ent + kMetaSlots * kTileEntries);  // [kMetaSlots][kTileEntries]
    u32* hist_s = reinterpret_cast<u32*>(meta_gs + kMetaSlots * kTileEntries);      // [kHistBins]

    const int t = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n = valid_lens[t];
    n = n < 0 ? 0 : (n > L * E ? L * E : n);
    const int first_tile = blockIdx.y * tiles_per_cta;
    if (first_tile * kTileEntries >= n) return;  // uniform: past the row's end
    const int last_tile = min(first_tile + tiles_per_cta, (n + kTileEntries - 1) / kTileEntries);
    const int num_tiles = last_tile - first_tile;
    const int* bt = block_table + (long long)t * L;

    // entry metadata of tile j (thread = entry): pool entry index (-1: unusable) and global scale
    auto load_meta = [&](int j) {
        const int s = (first_tile + j) * kTileEntries + tid;
        int ent = -1;
        float g = __int_as_float(0x7fc00000);  // NaN: never selected
        if (s < n) {
            const int lb = e_shift >= 0 ? s >> e_shift : s / E;
            const int slot = s - lb * E;
            const int b = bt[lb];
            if (b >= 0 && b < P) {
                ent = b * E + slot;  // < P * E < 2^31 (validated)
                g = key_gscale[b];
            }
        }
        meta_ent[(j % kMetaSlots) * kTileEntries + tid] = ent;
        meta_gs[(j % kMetaSlots) * kTileEntries + tid] = g;
    };
    // copies of tile j into its ring stage, from metadata already in shared memory
    auto load_tile = [&](int j) {
        unsigned char* st = ring + (j % kStages) * kStageBytes;
        const int* ents = meta_ent + (j % kMetaSlots) * kTileEntries;
#pragma unroll
        for (int i = tid; i < kTileEntries * kChunksPerRow; i += kThreads) {
            const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
            const int ent = ents[row];
            cp_async_16(st + row * kCodeBytes + chunk * 16,
                        keys_fp4 + (ent >= 0 ? (long long)ent * kCodeBytes + chunk * 16 : 0), ent >= 0);
        }
        const int ent = ents[tid];  // written by this thread itself
        u8* sdst = st + kScaleOffset + tid * kScaleBytes;
        if constexpr (kScaleBytes % 4 == 0) {
#pragma unroll
            for (int k = 0; k < kScaleBytes / 4; ++k)
                cp_async_4(sdst + 4 * k, key_scale + (ent >= 0 ? (long long)ent * kScaleBytes + 4 * k : 0), ent >= 0);
        } else {
            // D/16 not a multiple of 4 (D = 32, 96, 160, 224): rows are not 4-byte aligned
#pragma unroll
            for (int k = 0; k < kScaleBytes; ++k) sdst[k] = ent >= 0 ? key_scale[(long long)ent * kScaleBytes + k] : (u8)0;
        }
    };

    // ---- prologue: query and weights (first group), metadata and copies of the first stages
    {
        const unsigned char* qsrc = reinterpret_cast<const unsigned char*>(q16 + (long long)t * kHeads * kRowHalves);
        for (int i = tid; i < kQBytes / 16; i += kThreads) cp_async_16(smem + 16 * i, qsrc + 16 * i, true);
        for (int h = tid; h < kHeads; h += kThreads) wsm[h] = w_scaled[(long long)t * kHeads + h];
    }
    if (hist)
        for (int i = tid; i < kHistBins; i += kThreads) hist_s[i] = 0u;
    for (int j = 0; j < kStages; ++j)
        if (j < num_tiles) load_meta(j);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kStages - 1; ++j) {
        if (j < num_tiles) load_tile(j);
        cp_async_commit();  // group j (group 0 also holds the query)
    }

    const int g = lane >> 2, c = lane & 3;
    const int mi = lane >> 3;  // ldmatrix: matrix mi = lane / 8, row lane % 8
    const unsigned short* qrow = qs + (8 * (mi >> 1) + (lane & 7)) * kRowHalves + (mi & 1) * 8;
    float* out = scores + (long long)t * ld;
    const int row0 = warp * kPassEntries;  // my warp's 32 rows of a tile

    for (int it = 0; it < num_tiles; ++it) {
        cp_async_wait<kStages - 2>();  // tile it (and the query) landed, for this thread's copies
        __syncthreads();               // ... for everyone's; tile it-1 fully consumed; meta visible
        if (it + kStages - 1 < num_tiles) load_tile(it + kStages - 1);
        cp_async_commit();
        if (it + kStages < num_tiles) load_meta(it + kStages);

        const unsigned char* st = ring + (it % kStages) * kStageBytes;
        // my 4 rows r = 2*mb + hi: tile rows row0 + mb*16 + g + 8*hi
        u32 raw[2 * kMBlocks][kWords];
        u32 sc[2 * kMBlocks][kWords];  // fp16x2 (scale * 2^6) splat, per word
#pragma unroll
        for (int r = 0; r < 2 * kMBlocks; ++r) {
            const int row = row0 + (r >> 1) * 16 + g + (r & 1) * 8;
            const unsigned char* src = st + row * kCodeBytes + c * (kDim / 8);
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
            // word wd covers elements c*D/4 + 8*wd .. +7, scale group (c*D/4 + 8*wd) / 16
            const unsigned char* srow = st + kScaleOffset + row * kScaleBytes;
            if constexpr (kDim % 64 == 0) {
                // my groups are c*D/64 + m: words 2m and 2m+1 share group m; pairs of groups
                // are adjacent bytes, converted together
#pragma unroll
                for (int m2 = 0; m2 < kWords / 2; m2 += 2) {
                    const int g0 = c * (kDim / 64) + m2;
                    const u32 two = (m2 + 1 < kWords / 2) ? (u32)srow[g0] | ((u32)srow[g0 + 1] << 8) : (u32)srow[g0];
                    const u32 v = scales_to_f16x2(two);
                    sc[r][2 * m2] = sc[r][2 * m2 + 1] = splat_lo(v);
                    if (m2 + 1 < kWords / 2) sc[r][2 * m2 + 2] = sc[r][2 * m2 + 3] = splat_hi(v);
                }
            } else {
#pragma unroll
                for (int wd = 0; wd < kWords; ++wd)
                    sc[r][wd] = splat_lo(scales_to_f16x2(srow[(c * (kDim / 4) + 8 * wd) / 16]));
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
#pragma unroll
                for (int i = 0; i < 4; ++i) dec[r][i] = hmul2(dec[r][i], sc[r][wd]);
            }
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int ks = 2 * wd + hh;
#pragma unroll
                for (int jp = 0; jp < kNBlocks; jp += 2) {
                    u32 b[4];
                    ldmatrix_x4(b, qrow + jp * 8 * kRowHalves + ks * 16);
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
        const float* gs = meta_gs + (it % kMetaSlots) * kTileEntries;
        const int tile_start = (first_tile + it) * kTileEntries;
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
            float lo = 0.0f, hi = 0.0f;
#pragma unroll
            for (int j = 0; j < kNBlocks; ++j) {
                const float w0 = wsm[8 * j + 2 * c], w1 = wsm[8 * j + 2 * c + 1];
                lo = fmaf(w0, max_keep_nan(acc[mb][j][0], 0.0f), lo);
                lo = fmaf(w1, max_keep_nan(acc[mb][j][1], 0.0f), lo);
                hi = fmaf(w0, max_keep_nan(acc[mb][j][2], 0.0f), hi);
                hi = fmaf(w1, max_keep_nan(acc[mb][j][3], 0.0f), hi);
            }
            lo += __shfl_xor_sync(FULL_MASK, lo, 1);
            hi += __shfl_xor_sync(FULL_MASK, hi, 1);
            lo += __shfl_xor_sync(FULL_MASK, lo, 2);
            hi += __shfl_xor_sync(FULL_MASK, hi, 2);
            if (c < 2) {
                const int row = row0 + mb * 16 + g + 8 * c;  // lane c=0 writes row g, c=1 row g+8
                const float score = (c == 0 ? lo : hi) * gs[row] + 0.0f;
                out[tile_start + row] = score;
                if (hist && tile_start + row < n) {
                    const u32 key = score_to_key(score);
                    if (key) atomicAdd(&hist_s[key >> 21], 1u);
                }
            }
        }
    }
    cp_async_wait<0>();
    if (hist) {
        __syncthreads();
        u32* row_hist = hist + (long long)t * kHistBins;
        for (int i = tid; i < kHistBins; i += kThreads)
            if (hist_s[i]) atomicAdd(&row_hist[i], hist_s[i]);
    }
}
