// score_fp32.cu: the exact scoring path. FP32 dot products of every query head with every
// visible NVFP4 key, ReLU, weighted head sum, the block's global scale; scores to a row of
// a float32 workspace that the select kernels (select_fast.cu) then reduce.
//
// One CTA scores `tiles_per_cta` consecutive tiles of kTileEntries entries of one query
// row. The query (H x D, heads padded to a multiple of 8) is staged once per CTA in shared
// memory, transposed to [D][Hpad]; each key tile is decoded once per CTA, 32 dimensions at
// a time, into shared memory as float32 [32][kTileEntries] and used for all heads. Each
// thread owns an 8-head x 4-entry block of dot products (register tiling, as an SGEMM).
// The head sum of one entry is spread over kHeadGroups lanes of one warp and reduced with
// shuffles in a fixed order, so results are deterministic.
#include "common.cuh"

namespace score_fp32 {
constexpr int kTileEntries = 128;  // entries per tile: 32 entry groups of 4
constexpr int kChunk = 32;         // dimensions decoded per stage (two 16-element scale groups)
constexpr int kHeadsPerThread = 8;
constexpr int kEntriesPerThread = 4;
}  // namespace score_fp32

// The CTA's shared memory for kHeadGroups and D dimensions: its parts' lengths, in the
// order the kernel lays them out. bytes(D) is what indexer.geometry.score_fp32_launch sizes
// the launch to (checked at compile time by scripts/compile_kernels.py).
template <int kHeadGroups>
struct Fp32Smem {
    static constexpr int kHpad = 8 * kHeadGroups;
    __host__ __device__ static constexpr int q_floats(int D) { return D * kHpad; }  // float [D][kHpad]
    static constexpr int kKeyFloats = score_fp32::kChunk * score_fp32::kTileEntries;  // float [kChunk][kTileEntries]
    static constexpr int kWeightFloats = kHpad;                                        // float [kHpad]
    static constexpr int kScaleFloats = score_fp32::kTileEntries;                      // float [kTileEntries]
    static constexpr int kRowOffsets = score_fp32::kTileEntries;                       // long long [kTileEntries]
    static constexpr int kLutPairs = 256;                                              // float2 [256]
    __host__ __device__ static constexpr int bytes(int D) {
        return 4 * (q_floats(D) + kKeyFloats + kWeightFloats + kScaleFloats) + 8 * (kRowOffsets + kLutPairs);
    }
    // the long longs start 8-aligned for every D (q_floats is a multiple of 8)
    static_assert((kKeyFloats + kWeightFloats + kScaleFloats) % 2 == 0 && kHpad % 2 == 0, "rowoff alignment");
};

// kHeadGroups = Hpad / 8 (1, 2, 4, 8 or 16); the CTA has 32 * kHeadGroups threads.
template <int kHeadGroups, class QT = float>
__global__ void __launch_bounds__(32 * kHeadGroups)
score_fp32_kernel(const QT* __restrict__ q,               // [T, H, D]: float, half_bits, bf16_bits or e4m3_bits
                  const float* __restrict__ w,            // [T, H]
                  const u8* __restrict__ keys_fp4,        // [P, E, D/2]
                  const u8* __restrict__ key_scale,       // [P, E, D/16]
                  const float* __restrict__ key_gscale,   // [P]
                  const int* __restrict__ block_table,    // [T, L]
                  const int* __restrict__ valid_lens,     // [T]
                  int H, int D, int P, int E, int L,
                  int tiles_per_cta,
                  float* __restrict__ scores,             // [T, ld] workspace
                  long long ld)
{
    using namespace score_fp32;
    constexpr int kThreads = 32 * kHeadGroups;
    constexpr int kHpad = 8 * kHeadGroups;
    static_assert(kHeadGroups >= 1 && kHeadGroups <= 16 && (kHeadGroups & (kHeadGroups - 1)) == 0,
                  "kHeadGroups must be a power of two from 1 to 16");
    static_assert(kThreads / kHeadGroups * kEntriesPerThread == kTileEntries, "tile shape");

    using Smem = Fp32Smem<kHeadGroups>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* qs = reinterpret_cast<float*>(smem_raw);            // [D][kHpad]
    float* ks = qs + Smem::q_floats(D);                        // [kChunk][kTileEntries]
    float* ws = ks + Smem::kKeyFloats;                         // [kHpad]
    float* gs = ws + Smem::kWeightFloats;                      // [kTileEntries] gscale, NaN if unusable
    long long* rowoff = reinterpret_cast<long long*>(gs + Smem::kScaleFloats);  // [kTileEntries] entry index
    float2* lut = reinterpret_cast<float2*>(rowoff + Smem::kRowOffsets);         // [256] byte -> two E2M1 values

    const int t = blockIdx.x;
    const int tid = threadIdx.x;
    const int n = visible_len(valid_lens, t, L * E);
    const int first_tile = blockIdx.y * tiles_per_cta;
    if (first_tile * kTileEntries >= n) return;  // whole CTA past the row's end (uniform exit)
    const int last_tile = min(first_tile + tiles_per_cta, (n + kTileEntries - 1) / kTileEntries);

    // ---- stage the query, transposed and zero-padded to kHpad heads, and the weights
    const QT* qt = q + (long long)t * H * D;
    for (int i = tid; i < D * kHpad; i += kThreads) {
        const int d = i / kHpad, h = i % kHpad;
        qs[i] = h < H ? query_float(qt[h * D + d]) : 0.0f;
    }
    for (int h = tid; h < kHpad; h += kThreads) ws[h] = h < H ? w[(long long)t * H + h] : 0.0f;
    for (int b = tid; b < 256; b += kThreads) lut[b] = make_float2(e2m1_to_float(b & 15u), e2m1_to_float(b >> 4));

    const int hg = tid % kHeadGroups;     // my 8 heads: hg*8 .. hg*8+7
    const int eg = tid / kHeadGroups;     // my 4 entries: eg*4 .. eg*4+3
    const int half_d = D / 2, groups = D / 16;

    for (int tile = first_tile; tile < last_tile; ++tile) {
        const int tile_start = tile * kTileEntries;
        __syncthreads();  // previous tile's readers of gs/rowoff are done
        // ---- where each entry of the tile lives; unusable entries get a NaN scale
        for (int e = tid; e < kTileEntries; e += kThreads) {
            const int s = tile_start + e;
            float g = __int_as_float(0x7fc00000);
            long long off = -1;
            if (s < n) {
                const int b = block_table[(long long)t * L + s / E];
                if (b >= 0 && b < P) {
                    g = key_gscale[b];
                    off = (long long)b * E + s % E;
                }
            }
            gs[e] = g;
            rowoff[e] = off;
        }

        float acc[kHeadsPerThread][kEntriesPerThread];
#pragma unroll
        for (int j = 0; j < kHeadsPerThread; ++j)
#pragma unroll
            for (int c = 0; c < kEntriesPerThread; ++c) acc[j][c] = 0.0f;

        for (int d0 = 0; d0 < D; d0 += kChunk) {
            __syncthreads();  // rowoff visible; previous stage's readers of ks are done
            // ---- decode 32 dimensions of each entry: one item is (entry, 16-element scale
            // group); a warp takes 32 consecutive entries of one group, so its transposed
            // stores hit 32 different banks. Bytes decode to two floats through a table.
            for (int item = tid; item < 2 * kTileEntries; item += kThreads) {
                const int e = item % kTileEntries, grp = item / kTileEntries;
                const long long off = rowoff[e];
                float v[16];
                if (off >= 0) {
                    const uint2 packed = *reinterpret_cast<const uint2*>(keys_fp4 + off * half_d + d0 / 2 + grp * 8);
                    const float sc = e4m3_to_float(key_scale[off * groups + d0 / 16 + grp]);
                    const u32 words[2] = {packed.x, packed.y};
#pragma unroll
                    for (int b = 0; b < 8; ++b) {
                        const float2 pair = lut[(words[b / 4] >> (8 * (b % 4))) & 255u];
                        v[2 * b] = pair.x * sc;  // exact in float32
                        v[2 * b + 1] = pair.y * sc;
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 16; ++i) v[i] = 0.0f;
                }
#pragma unroll
                for (int i = 0; i < 16; ++i) ks[(grp * 16 + i) * kTileEntries + e] = v[i];
            }
            __syncthreads();
            // ---- 8 heads x 4 entries of FP32 FMAs per thread and dimension
#pragma unroll 8
            for (int i = 0; i < kChunk; ++i) {
                const float4 qa = *reinterpret_cast<const float4*>(qs + (d0 + i) * kHpad + hg * 8);
                const float4 qb = *reinterpret_cast<const float4*>(qs + (d0 + i) * kHpad + hg * 8 + 4);
                const float4 kv = *reinterpret_cast<const float4*>(ks + i * kTileEntries + eg * 4);
                const float qh[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
                const float kc[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
                for (int j = 0; j < kHeadsPerThread; ++j)
#pragma unroll
                    for (int c = 0; c < kEntriesPerThread; ++c) acc[j][c] = fmaf(qh[j], kc[c], acc[j][c]);
            }
        }

        // ---- ReLU, weighted sum over my 8 heads, then over the head groups of the warp
        float part[kEntriesPerThread];
#pragma unroll
        for (int c = 0; c < kEntriesPerThread; ++c) {
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < kHeadsPerThread; ++j) {
                const int h = hg * 8 + j;
                if (h < H) sum = fmaf(ws[h], relu_keep_nan(acc[j][c]), sum);
            }
            part[c] = sum;
        }
#pragma unroll
        for (int off = 1; off < kHeadGroups; off <<= 1)
#pragma unroll
            for (int c = 0; c < kEntriesPerThread; ++c) part[c] += __shfl_xor_sync(FULL_MASK, part[c], off);

        if (hg == 0) {
            // relu(g x) = g relu(x) for g > 0: the block's global scale is applied last
            const int e0 = eg * 4;
            float4 out;
            out.x = part[0] * gs[e0 + 0] + 0.0f;
            out.y = part[1] * gs[e0 + 1] + 0.0f;
            out.z = part[2] * gs[e0 + 2] + 0.0f;
            out.w = part[3] * gs[e0 + 3] + 0.0f;
            // ld is a multiple of kTileEntries, so the whole tile lies inside the row
            *reinterpret_cast<float4*>(scores + (long long)t * ld + tile_start + e0) = out;
        }
    }
}
