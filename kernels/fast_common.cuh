// fast_common.cuh: what the tensor-core scoring kernels share.
//
//   * NVFP4 -> fp16 in registers. An E2M1 nibble placed into fp16 bits (sign -> bit 15,
//     magnitude -> bits 9..11) is the value times 2^-14 exactly (code 1 becomes an fp16
//     subnormal); one fp16 multiply by (E4M3 scale * 2^6) gives e2m1 * scale * 2^-8, exact
//     in fp16 for every code and scale (at most 6 significant bits, lowest bit >= 2^-23).
//   * The K permutation. A thread holding fragment column c (lane % 4) of an MMA row loads
//     the D/8 contiguous code bytes c*D/8 .. of that row; K slot kk of k-step s = 2*wd + hh
//     holds element d = c*D/4 + 8*wd + 4*hh + 2*j + lohi (c = (kk % 8) / 2, j = kk % 2,
//     lohi = kk / 8). The query is laid out in the same order (prep_query_kernel), so the
//     dot product is unchanged. Each run of 4 elements of a k-step shares one scale group.
//   * KeyRing: keys stream through kStages shared-memory tiles of 128 entries filled with
//     cp.async (zero fill past the row's end or behind an out-of-range block id); entry
//     metadata (pool entry, global scale) runs one tile ahead in a ring of its own, so the
//     loop needs one barrier per tile.
#pragma once
#include "common.cuh"

// INDEXER_CVT_E4M3X2: common.cuh (the float8 query's widening uses it too)

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

// The same eight codes through the hardware E4M3 conversion (INDEXER_CVT_E4M3X2), each value
// times 2^-6: nibble s|ee|m becomes the E4M3 byte s|0ee|m00, whose value is the E2M1 value
// times 2^-6 exactly (E4M3 subnormals cover code 1). Five logic ops and four conversions
// instead of fourteen logic ops; same output order as e2m1x8_to_f16x2.
__device__ __forceinline__ void e2m1x8_to_f16x2_cvt(u32 x, u32* out) {
#if INDEXER_CVT_E4M3X2
    const u32 lo = ((x << 4) & 0x80808080u) | ((x << 2) & 0x1c1c1c1cu);  // low nibbles of B0..B3
    const u32 hi = (x & 0x80808080u) | ((x >> 2) & 0x1c1c1c1cu);         // high nibbles
    asm("{ .reg .b16 l0, h0, l1, h1;\n"
        "mov.b32 {l0, h0}, %4;\n"
        "mov.b32 {l1, h1}, %5;\n"
        "cvt.rn.f16x2.e4m3x2 %0, l0;\n"
        "cvt.rn.f16x2.e4m3x2 %1, l1;\n"
        "cvt.rn.f16x2.e4m3x2 %2, h0;\n"
        "cvt.rn.f16x2.e4m3x2 %3, h1; }"
        : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
        : "r"(lo), "r"(hi));
#else
    e2m1x8_to_f16x2(x, out);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = hmul2(out[i], 0x5c005c00u);  // * 2^8: from 2^-14 to 2^-6
#endif
}

// Two E4M3 bytes (low 16 bits of `pair`) -> fp16x2 (scale0 * m, scale1 * m) for the fp16x2
// multiplier kMul (2^6 for e2m1x8_to_f16x2, 2^-2 for e2m1x8_to_f16x2_cvt), exact; NaN
// bytes give NaN. One hardware conversion and one multiply.
template <u32 kMul = 0x54005400u>
__device__ __forceinline__ u32 scales_to_f16x2(u32 pair) {
    u32 h;
#if INDEXER_CVT_E4M3X2
    asm("{ .reg .b16 lo; cvt.u16.u32 lo, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(h) : "r"(pair));
#else
    const float s0 = e4m3_to_float(pair & 255u), s1 = e4m3_to_float((pair >> 8) & 255u);
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(s1), "f"(s0));
#endif
    return hmul2(h, kMul);
}

// (lo, lo) and (hi, hi) of an fp16x2, as half moves: ptxas folds them into the consuming
// fp16x2 multiply's operand selector (HMUL2 ... R.H0_H0), where a byte permute was an ALU
// instruction of its own (8 a tile in the single-query kernel's loop: decode-1M scoring -2%,
// docs/performance.md v65)
__device__ __forceinline__ u32 splat_lo(u32 v) {
    u32 d;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {l, l}; }" : "=r"(d) : "r"(v));
    return d;
}
__device__ __forceinline__ u32 splat_hi(u32 v) {
    u32 d;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {h, h}; }" : "=r"(d) : "r"(v));
    return d;
}

__device__ __forceinline__ float relu_nan(float x) { return max_keep_nan(x, 0.0f); }
// 2 ReLU(x), NaN kept, in one add: x + |x| is exactly 2x for x >= 0 (the scoring kernels'
// accumulators stay far below overflow), +0 for x <= 0 (-0 included), NaN for NaN
__device__ __forceinline__ float twice_relu_nan(float x) { return x + fabsf(x); }

// The query's per-head power-of-two scale (prep_query_kernel and the warp-specialised
// kernel's own staging share it, so both stage the same fp16 values): e such that the
// head's largest |q| times 2^e lies in [2^14, 2^15), 0 for an all-zero or non-finite head.
__device__ __forceinline__ int query_scale_exponent(float amax) {
    int e = 0;
    if (amax > 0.0f && amax <= 3.402823466e38f) {
        int ex;
        frexpf(amax, &ex);  // amax in [2^(ex-1), 2^ex)
        e = 15 - ex;
    }
    return e;
}

// 2^e as two float factors, for e = query_scale_exponent(..) in [-113, 163]: each factor
// is a normal float, and x * a * b equals ldexpf(x, e) wherever the result can reach fp16
// (the first product moves x towards the final range, so it is exact whenever the final one
// is above 2^-126) in two multiplies, where ldexpf takes four and branches.
struct Pow2Scale {
    float a, b;
};
__device__ __forceinline__ Pow2Scale pow2_scale(int e) {
    const int e1 = e >> 1, e2 = e - e1;
    return {__int_as_float((127 + e1) << 23), __int_as_float((127 + e2) << 23)};
}

// x * 2^e rounded to fp16 (bits)
__device__ __forceinline__ unsigned short scaled_half_bits(float x, Pow2Scale s) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x * s.a * s.b));
    return h;
}

// (lo, hi) * 2^e rounded to fp16x2 (lo in the low half), one conversion
__device__ __forceinline__ u32 scaled_half2_bits(float lo, float hi, Pow2Scale s) {
    u32 h;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hi * s.a * s.b), "f"(lo * s.a * s.b));
    return h;
}

// ---------------------------------------------------------------------------
// Query staging, once per call: q[t] (H x D float32, float16 or bfloat16) -> fp16 [kHeads][D + 8] in the K order
// of the register-A decode of the mma.sync and wgmma kernels, each head scaled by a power
// of two 2^e that brings max |q| into [2^14, 2^15); and w[t, h] * 2^(8 - e) (folding back
// that power and the 2^-8 of the keys). K slot kk of k-step s = 2*wd + hh holds
// d = c*D/4 + 8*wd + 4*hh + 2*j + lohi, where c = (kk % 8) / 2, j = kk % 2, lohi = kk / 8.
// (score_ws.cu stages its own queries, in its own order, with the same arithmetic; the
// wgmma pair kernel stages its own in this order: QueryStaging in wgmma_common.cuh.)
template <int kDim>
__device__ __forceinline__ int prep_slot_dim(int i) {
    const int ks = i / 16, kk = i % 16;
    const int wd = ks / 2, hh = ks % 2, c = (kk % 8) / 2, jj = kk % 2, lohi = kk / 8;
    return c * (kDim / 4) + 8 * wd + 4 * hh + 2 * jj + lohi;
}

constexpr int kPrepHeadsPerWarp = 2;  // the launcher's grid: (T, kHeads / (8 * kPrepHeadsPerWarp))

// Where prep_query_row puts query t's head h: the staged rows [T][kHeads][kDim + 8] (their
// padding slots zero) and the weights [T][kHeads]. A policy of this shape (kPairs, pair(),
// weight()) may put them elsewhere: score_ks.cu's query images.
template <int kDim, int kHeads>
struct PrepToRows {
    unsigned short* __restrict__ q16;
    float* __restrict__ w_scaled;
    static constexpr int kPairs = (kDim + 8) / 2;  // slot pairs a head, the padding's included
    __device__ __forceinline__ void pair(int t, int h, int pr, u32 v) const {
        reinterpret_cast<u32*>(q16 + ((long long)t * kHeads + h) * (kDim + 8))[pr] = v;
    }
    __device__ __forceinline__ void weight(int t, int h, float v) const { w_scaled[(long long)t * kHeads + h] = v; }
};

template <int kDim, int kNBlocks, class Out, class QT>
__device__ __forceinline__ void prep_query_row(const QT* __restrict__ q, const float* __restrict__ w, int H,
                                               const Out out) {
    // grid (T, kHeads / 16), 8 warps of two heads each. Both heads' loads are in flight
    // together (latency, not bandwidth, bounds this kernel: it ran at ~2/3 of the copy rate
    // with one head a warp), and each head is permuted through shared memory.
    constexpr int kHeads = 8 * kNBlocks, kPer = kDim / 32, kHpw = kPrepHeadsPerWarp;
    static_assert(kHeads % (8 * kHpw) == 0, "whole warps of heads");
    __shared__ float row_s[8][kDim];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h0 = (blockIdx.y * 8 + warp) * kHpw;
    float v[kHpw][kPer];
#pragma unroll
    for (int k = 0; k < kHpw; ++k) {
        const QT* qh = q + ((long long)t * H + h0 + k) * kDim;
#pragma unroll
        for (int j = 0; j < kPer; ++j) v[k][j] = h0 + k < H ? query_float(qh[lane + 32 * j]) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kHpw; ++k) {
        const int h = h0 + k;
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < kPer; ++j) amax = fmaxf(amax, fabsf(v[k][j]));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, off));
        const int e = query_scale_exponent(amax);
        const Pow2Scale sc = pow2_scale(e);
        __syncwarp();  // the last head's reads of row_s are done
#pragma unroll
        for (int j = 0; j < kPer; ++j) row_s[warp][lane + 32 * j] = v[k][j];
        __syncwarp();
        // two slots a store (rows of kDim + 8 halves are 16-byte aligned)
        for (int pr = lane; pr < Out::kPairs; pr += 32) {
            unsigned short lo = 0, hi = 0;
            if (2 * pr < kDim) {
                lo = scaled_half_bits(row_s[warp][prep_slot_dim<kDim>(2 * pr)], sc);
                hi = scaled_half_bits(row_s[warp][prep_slot_dim<kDim>(2 * pr + 1)], sc);
            }
            out.pair(t, h, pr, (u32)lo | ((u32)hi << 16));
        }
        if (lane == 0) out.weight(t, h, h < H ? ldexpf(w[(long long)t * H + h], 8 - e) : 0.0f);
    }
}

// ---------------------------------------------------------------------------
// KeyRing: the key stream of one CTA of kTileEntries (128) threads over the tiles
// first_tile, first_tile + 1, ... of one query row.
// ---------------------------------------------------------------------------
template <int kDim>
struct KeyRing {
    static constexpr int kCodeBytes = kDim / 2, kScaleBytes = kDim / 16;
    static constexpr int kChunksPerRow = kCodeBytes / 16;
    static constexpr int kStageBytes = mma_stage_bytes(kDim);
    static constexpr int kScaleOffset = score_mma::kTileEntries * kCodeBytes;
    static constexpr int kMetaSlots = score_mma::kStages + 1;  // metadata runs one tile ahead
    static constexpr int kTile = score_mma::kTileEntries;
    //: shared memory the ring takes
    static constexpr int kSmemBytes = score_mma::kStages * kStageBytes + kMetaSlots * kTile * 8;

    unsigned char* ring;
    int* meta_ent;
    float* meta_gs;
    const u8* __restrict__ keys_fp4;
    const u8* __restrict__ key_scale;
    const float* __restrict__ key_gscale;
    const int* __restrict__ bt;
    int P, E, e_shift, n, first_tile, num_tiles;
    // metadata loads in flight (per thread): the block of tile it + kStages + 1, and the block
    // and global scale of tile it + kStages
    int b_next2, b_next;
    float g_next;

    // The tiles of query row t that this CTA scores: false when there are none (the whole
    // CTA returns). n is the row's visible length, clamped to [0, L*E].
    __device__ bool init(unsigned char* smem, const u8* k, const u8* s, const float* g, const int* block_table,
                         const int* valid_lens, int t, int P_, int E_, int e_shift_, int L, int tiles_per_cta) {
        ring = smem;
        meta_ent = reinterpret_cast<int*>(smem + score_mma::kStages * kStageBytes);
        meta_gs = reinterpret_cast<float*>(meta_ent + kMetaSlots * kTile);
        keys_fp4 = k; key_scale = s; key_gscale = g; bt = block_table + (long long)t * L;
        P = P_; E = E_; e_shift = e_shift_;
        n = visible_len(valid_lens, t, L * E);
        first_tile = blockIdx.y * tiles_per_cta;
        num_tiles = min(first_tile + tiles_per_cta, (n + kTile - 1) / kTile) - first_tile;
        return num_tiles > 0;
    }

    // Before the loop: metadata of the first kStages tiles (visible after the caller's
    // barrier) and the loads of the next two in flight.
    __device__ void prime_metadata(int tid) {
        for (int j = 0; j < score_mma::kStages; ++j)
            if (j < num_tiles) load_meta(j, tid);
        b_next2 = score_mma::kStages + 1 < num_tiles ? block_of(score_mma::kStages + 1, tid) : -1;
        b_next = score_mma::kStages < num_tiles ? block_of(score_mma::kStages, tid) : -1;
        g_next = scale_of(b_next);
    }

    // After that barrier: copies of the first kStages - 1 tiles, one commit group each (copies
    // the caller issued before this join group 0).
    __device__ void start_copies(int tid) {
#pragma unroll
        for (int j = 0; j < score_mma::kStages - 1; ++j) {
            if (j < num_tiles) load_tile(j, tid);
            cp_async_commit();
        }
    }

    // Top of loop iteration it: wait until tile it has landed for every thread (one barrier,
    // which also retires the reads of tile it - 1), refill the ring, advance the metadata.
    __device__ void begin_tile(int it, int tid) {
        constexpr int S = score_mma::kStages;
        cp_async_wait<S - 2>();
        __syncthreads();
        if (it + S - 1 < num_tiles) load_tile(it + S - 1, tid);
        cp_async_commit();
        if (it + S < num_tiles) put_meta(it + S, tid, b_next, g_next);
        b_next = b_next2;
        g_next = scale_of(b_next);  // for tile it + S + 1, stored next iteration
        b_next2 = it + S + 2 < num_tiles ? block_of(it + S + 2, tid) : -1;
    }
    __device__ const unsigned char* stage(int j) const { return ring + (j % score_mma::kStages) * kStageBytes; }
    __device__ const float* gs(int j) const { return meta_gs + (j % kMetaSlots) * kTile; }

    // Metadata of tile j (thread tid = entry): pool entry (-1: unusable) and global scale (NaN),
    // in three steps so that no thread waits on its own global loads: block_of issues the
    // block-table load of tile j, scale_of the global-scale load of that block (a later tile
    // iteration), put_meta stores both (later still). load_meta does all three at once.
    __device__ int block_of(int j, int tid) const {
        const int s = (first_tile + j) * kTile + tid;
        if (s >= n) return -1;
        const int b = bt[e_shift >= 0 ? s >> e_shift : s / E];
        return (b >= 0 && b < P) ? b : -1;
    }
    __device__ float scale_of(int b) const { return b >= 0 ? key_gscale[b] : __int_as_float(0x7fc00000); }
    __device__ void put_meta(int j, int tid, int b, float g) {
        const int s = (first_tile + j) * kTile + tid;
        const int lb = e_shift >= 0 ? s >> e_shift : s / E;
        meta_ent[(j % kMetaSlots) * kTile + tid] = b >= 0 ? b * E + (s - lb * E) : -1;  // < P * E < 2^31
        meta_gs[(j % kMetaSlots) * kTile + tid] = g;
    }
    __device__ void load_meta(int j, int tid) {
        const int b = block_of(j, tid);
        put_meta(j, tid, b, scale_of(b));
    }

    // cp.async copies of tile j into its stage, from metadata already visible to all threads
    __device__ void load_tile(int j, int tid) {
        unsigned char* st = ring + (j % score_mma::kStages) * kStageBytes;
        const int* ents = meta_ent + (j % kMetaSlots) * kTile;
#pragma unroll
        for (int k = 0; k < kChunksPerRow; ++k) {
            const int i = tid + k * kTile;  // consecutive threads: consecutive chunks of a row
            const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
            const int ent = ents[row];
            cp_async_16(st + row * kCodeBytes + chunk * 16,
                        keys_fp4 + (ent >= 0 ? (long long)ent * kCodeBytes + chunk * 16 : 0), ent >= 0);
        }
        const int ent = ents[tid];
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
    }
};

// My (fragment column c) code words of tile row `row`, and the fp16x2 (scale * 2^6) splat of
// each word's 16-element group.
template <int kDim, u32 kScaleMul = 0x54005400u>
__device__ __forceinline__ void read_row(const unsigned char* st, int row, int c, u32 (&raw)[kDim / 32],
                                         u32 (&sc)[kDim / 32]) {
    using Ring = KeyRing<kDim>;
    constexpr int kWords = kDim / 32;
    const unsigned char* src = st + row * Ring::kCodeBytes + c * (kDim / 8);
    if constexpr (kWords % 4 == 0) {
#pragma unroll
        for (int v = 0; v < kWords / 4; ++v) {
            const uint4 x = reinterpret_cast<const uint4*>(src)[v];
            raw[4 * v] = x.x; raw[4 * v + 1] = x.y; raw[4 * v + 2] = x.z; raw[4 * v + 3] = x.w;
        }
    } else if constexpr (kWords % 2 == 0) {
#pragma unroll
        for (int v = 0; v < kWords / 2; ++v) {
            const uint2 x = reinterpret_cast<const uint2*>(src)[v];
            raw[2 * v] = x.x; raw[2 * v + 1] = x.y;
        }
    } else {
#pragma unroll
        for (int v = 0; v < kWords; ++v) raw[v] = reinterpret_cast<const u32*>(src)[v];
    }
    // word wd covers elements c*D/4 + 8*wd .. +7, scale group (c*D/4 + 8*wd) / 16
    const unsigned char* srow = st + Ring::kScaleOffset + row * Ring::kScaleBytes;
    if constexpr (kDim % 64 == 0) {
        // my groups are c*D/64 + m: words 2m and 2m+1 share group m; two groups per conversion
#pragma unroll
        for (int m2 = 0; m2 < kWords / 2; m2 += 2) {
            const int g0 = c * (kDim / 64) + m2;
            u32 two;
            if constexpr (kDim % 128 == 0)  // g0 even: one aligned 16-bit load
                two = *reinterpret_cast<const unsigned short*>(srow + g0);
            else
                two = (m2 + 1 < kWords / 2) ? (u32)srow[g0] | ((u32)srow[g0 + 1] << 8) : (u32)srow[g0];
            const u32 v = scales_to_f16x2<kScaleMul>(two);
            sc[2 * m2] = sc[2 * m2 + 1] = splat_lo(v);
            if (m2 + 1 < kWords / 2) sc[2 * m2 + 2] = sc[2 * m2 + 3] = splat_hi(v);
        }
    } else {
#pragma unroll
        for (int wd = 0; wd < kWords; ++wd) sc[wd] = splat_lo(scales_to_f16x2<kScaleMul>(srow[(c * (kDim / 4) + 8 * wd) / 16]));
    }
}

// The final score of an entry: head sum times the block's global scale (-0 folded into +0);
// written to the row's workspace and counted into the CTA's histogram of key top bits.
__device__ __forceinline__ void store_score(float* out, int s, float head_sum, float gscale, int n, u32* hist_s) {
    const float score = head_sum * gscale + 0.0f;
    out[s] = score;
    if (hist_s && s < n) {
        const u32 key = score_to_key(score);
        if (key) atomicAdd(&hist_s[key >> 21], 1u);
    }
}

// Add a CTA's histogram of raw bins (raw_bin_of_plus_zero) to the row's key-bin one.
__device__ __forceinline__ void flush_raw_histogram(const u32* hist_s, u32* row_hist, int tid, int threads) {
    for (int i = tid; i < score_mma::kHistBins; i += threads)
        if (hist_s[i]) atomicAdd(&row_hist[key_bin_of_raw_bin(i)], hist_s[i]);
}

// Add a CTA's histogram to the row's (only the bins it touched).
__device__ __forceinline__ void flush_histogram(const u32* hist_s, u32* row_hist, int tid, int threads) {
    for (int i = tid; i < score_mma::kHistBins; i += threads)
        if (hist_s[i]) atomicAdd(&row_hist[i], hist_s[i]);
}
