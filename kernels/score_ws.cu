// score_ws.cu: warp-specialised scoring on Hopper (sm_90a) for D = 128, H <= 64: the NVFP4
// decode runs in a warpgroup of its own, off the tensor cores' critical path.
//
// One CTA per SM, three warpgroups, the balanced schedule of score_wgmma.cu (the tiles of up
// to 1,024 rows, concatenated, cut into equal ranges, one per CTA):
//   * producer (warpgroup 2): streams 128-entry key tiles through BulkRing (bulk copies of
//     whole pool-block runs), decodes each tile to fp16 (e2m1 x e4m3, exact) into one of
//     kDecStages stages in wgmma's K-major core-matrix layout (8 entries x 8 K-values per
//     128-byte core matrix; 128 bytes apart along the entries, kLbo = 2048 along K), writes
//     the tile's global scales beside it, and marks the stage full (an mbarrier);
//   * consumers (warpgroups 0 and 1) take alternate tiles: 8 x wgmma.m64n128k16 with A = the
//     query (64 heads x 128 K, fp16 fragments held in registers while the row lasts) and
//     B = the decoded stage, release the stage, then the epilogue: ReLU (NaN kept), the
//     head weights, the sum over 64 heads (2 in a thread, 8 lanes by a transposing
//     butterfly, 4 warps through shared memory, in a fixed order), the block's global scale,
//     the score store and the histogram count. One consumer's epilogue runs under the
//     other's MMAs.
// K order: slot 8*kc + i of k-chunk kc holds dim 8*kc + (i with bits 0 and 1 swapped): the
// order in which the E4M3 conversion emits the eight codes of a 32-bit word (see
// e2m1x8_to_f16x2_cvt); prep_query_chunked_kernel stages the query in the same order.
// Output: score_wgmma.cu's (scores of every entry of each touched tile, histogram of the
// keys' top 11 bits of the visible ones); scores differ from it only by summation order.
#include "wgmma_common.cuh"

namespace score_ws {
constexpr int kDim = 128;                      // the head dim this kernel takes
constexpr int kTile = 128;                     // entries per tile = N of the MMA
constexpr int kThreads = 384;                  // two consumer warpgroups, one producer
constexpr int kDecStages = 4;                  // decoded fp16 tiles in flight
constexpr int kRingStages = 4;                 // NVFP4 tiles in flight (bulk copies)
constexpr int kDecBytes = kTile * kDim * 2;    // one decoded stage: 32 KB
constexpr int kLbo = (kTile / 8) * 128;        // bytes between core matrices along K
constexpr int kSbo = 128;                      // ... along the entries
constexpr int kProducerBarrier = 3;            // named barriers: consumers 1 and 2, producer 3
constexpr int kHistBins = score_mma::kHistBins;
using Ring = BulkRing<kDim, kRingStages, kProducerBarrier>;
}  // namespace score_ws

struct WsSmem {
    static constexpr int kDec = 0;                                                     // [kDecStages][32 KB]
    static constexpr int kDecGs = kDec + score_ws::kDecStages * score_ws::kDecBytes;   // float[kDecStages][128]
    static constexpr int kRing = kDecGs + score_ws::kDecStages * score_ws::kTile * 4;  // BulkRing stages
    static constexpr int kRingGs = kRing + score_ws::kRingStages * score_ws::Ring::kStageBytes;
    static constexpr int kRingBars = kRingGs + score_ws::kRingStages * score_ws::kTile * 4;
    static constexpr int kFull = kRingBars + score_ws::kRingStages * 8;
    static constexpr int kEmpty = kFull + score_ws::kDecStages * 8;
    static constexpr int kHist = kEmpty + score_ws::kDecStages * 8;                    // u32[2][kHistBins]
    static constexpr int kRed = kHist + 2 * score_ws::kHistBins * 4;                   // float[2][2][4][128]
    static constexpr int kSched = kRed + 2 * 2 * 4 * score_ws::kTile * 4;              // int[kMaxBalancedRows + 1]
    static constexpr int kScratch = kSched + (score_wgmma::kMaxBalancedRows + 1) * 4;  // u32[32]
    static constexpr int kBytes = kScratch + 32 * 4;
    static_assert(kRing % 128 == 0 && kFull % 8 == 0, "bulk-copy and barrier alignment");
};

// Add a consumer's histogram to the row's and zero it (the consumer's 128 threads).
__device__ __forceinline__ void flush_and_clear_histogram(u32* hist_s, u32* row_hist, int ct) {
    for (int i = ct; i < score_ws::kHistBins; i += 128) {
        const u32 v = hist_s[i];
        if (v) {
            atomicAdd(&row_hist[i], v);
            hist_s[i] = 0u;
        }
    }
}

// One step of the transposing butterfly: lanes that differ in lane bit kHalf exchange halves
// of their first 2 * kHalf values; the lane with the bit set keeps (and sums) the upper half,
// the other the lower, each left in part[0 .. kHalf - 1].
template <int kHalf>
__device__ __forceinline__ void butterfly_step(float (&part)[32], int lane) {
    const bool upper = lane & kHalf;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? part[i] : part[i + kHalf];
        const float keep = upper ? part[i + kHalf] : part[i];
        part[i] = keep + __shfl_xor_sync(FULL_MASK, send, kHalf);
    }
}

// Producer warpgroup: every tile of this CTA's range [g0, g1), in order, decoded into
// stage j % kDecStages (j = the tile's position in the range).
__device__ __forceinline__ void ws_produce(unsigned char* smem, const int* start, int T, int g0, int g1,
                                           const u8* __restrict__ keys_fp4, const u8* __restrict__ key_scale,
                                           const float* __restrict__ key_gscale, const int* __restrict__ block_table,
                                           const int* __restrict__ valid_lens, int P, int E, int e_shift, int L) {
    using namespace score_ws;
    const int p = threadIdx.x - 2 * 128, lane = p & 31, pw = p >> 5;
    u64* full = reinterpret_cast<u64*>(smem + WsSmem::kFull);
    u64* empty = reinterpret_cast<u64*>(smem + WsSmem::kEmpty);
    float* dec_gs = reinterpret_cast<float*>(smem + WsSmem::kDecGs);
    Ring ring;
    ring.ring = smem + WsSmem::kRing;
    ring.meta_gs = reinterpret_cast<float*>(smem + WsSmem::kRingGs);
    ring.bars = reinterpret_cast<u64*>(smem + WsSmem::kRingBars);
    ring.keys_fp4 = keys_fp4; ring.key_scale = key_scale; ring.key_gscale = key_gscale;
    ring.P = P; ring.E = E; ring.e_shift = e_shift;
    ring.row_shift = e_shift < 7 ? e_shift : 7;
    ring.copies = kTile >> ring.row_shift;
    // My units of a tile: the 16-byte code chunk q (dims 32q .. 32q + 31) of entries
    // 8 * (pw + 4i) + (lane & 7), i = 0..3. Each quarter-warp covers 8 consecutive entries
    // with two lanes per chunk: its ring reads (entry * 64 + 16q) and its decoded stores
    // ((entry & 7) * 16 within a 128-byte core-matrix row) are free of bank conflicts.
    const int q = (((lane & 7) >> 1) + (lane >> 3)) & 3;
    const int max_len = L * E;
    int g = g0, t = item_of_tile(start, T, g0), jbase = 0;
    while (true) {
        const int first = g - start[t], num = min(g1, start[t + 1]) - g;
        ring.bt = block_table + (long long)t * L;
        ring.n = visible_len(valid_lens, t, max_len);
        ring.first_tile = first; ring.num_tiles = num; ring.jbase = jbase;
        ring.start(p);
        for (int it = 0; it < num; ++it) {
            ring.begin_tile(it, p);
            const int j = jbase + it, s = j % kDecStages;
            if (j >= kDecStages) mbar_wait(empty + s, (u32)((j / kDecStages) + 1) & 1u);
            const unsigned char* st = ring.stage(it);
            unsigned char* dst = smem + WsSmem::kDec + s * kDecBytes;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int e = 8 * (pw + 4 * i) + (lane & 7);
                const uint4 code = *reinterpret_cast<const uint4*>(st + e * (kDim / 2) + 16 * q);
                const u32 two = *reinterpret_cast<const unsigned short*>(st + Ring::kScaleOffset + e * (kDim / 16) + 2 * q);
                const u32 sv = scales_to_f16x2<score_wgmma::kScaleMul>(two);  // groups 2q, 2q + 1
                const u32 words[4] = {code.x, code.y, code.z, code.w};
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    u32 d[4];
                    e2m1x8_to_f16x2_cvt(words[w], d);  // dims 8kc + {0,2}, {1,3}, {4,6}, {5,7}
                    const u32 sc = w < 2 ? splat_lo(sv) : splat_hi(sv);
                    const int kc = 4 * q + w;
                    *reinterpret_cast<uint4*>(dst + kc * kLbo + (e >> 3) * 128 + (e & 7) * 16) =
                        make_uint4(hmul2(d[0], sc), hmul2(d[1], sc), hmul2(d[2], sc), hmul2(d[3], sc));
                }
                if (q == 0) dec_gs[s * kTile + e] = ring.gscale(it, e);
            }
            fence_proxy_async();  // the stage, written through the generic proxy, is read by wgmma
            mbar_arrive(full + s);
        }
        named_barrier(kProducerBarrier, 128);  // every ring stage read before the next row refills them
        jbase += num;
        g += num;
        if (g >= g1) break;
        do { ++t; } while (start[t + 1] <= g);  // the next row with tiles
    }
}

// Consumer warpgroup cw (0 or 1): tiles j = cw, cw + 2, ... of this CTA's range.
__device__ __forceinline__ void ws_consume(unsigned char* smem, const int* start, int T, int g0, int g1,
                                           const unsigned short* __restrict__ q16, const float* __restrict__ w_scaled,
                                           const int* __restrict__ valid_lens, int max_len,
                                           float* __restrict__ scores, long long ld, u32* __restrict__ hist) {
    using namespace score_ws;
    constexpr int kRowHalves = kDim + 8;
    const int cw = threadIdx.x >> 7, ct = threadIdx.x & 127, lane = ct & 31, warp = ct >> 5;
    const int g = lane >> 2, c = lane & 3, bar_id = 1 + cw;
    u64* full = reinterpret_cast<u64*>(smem + WsSmem::kFull);
    u64* empty = reinterpret_cast<u64*>(smem + WsSmem::kEmpty);
    const float* dec_gs = reinterpret_cast<const float*>(smem + WsSmem::kDecGs);
    u32* hist_s = reinterpret_cast<u32*>(smem + WsSmem::kHist) + cw * kHistBins;
    float* red = reinterpret_cast<float*>(smem + WsSmem::kRed) + cw * (2 * 4 * kTile);
    const bool count_keys = hist != nullptr;
    const int h0 = 16 * warp + g;  // my heads: rows h0 and h0 + 8 of the MMA
    // After the butterfly, lane (g, c) holds the sums of its warp's 16 heads for entries
    // 16g + 8(i/2) + 2c + (i%2), i = 0..3; thread ct finishes slot ct of that layout.
    const int xl = ct >> 2, xi = ct & 3;
    const int my_entry = 16 * (xl >> 2) + 8 * (xi >> 1) + 2 * (xl & 3) + (xi & 1);

    u32 qa[kDim / 16][4];
    float w0 = 0.0f, w1 = 0.0f;
    int t = -1, n = 0, row_end = 0, buf = 0;
    float* out = scores;
    for (int j = cw; g0 + j < g1; j += 2) {
        const int gt = g0 + j;
        if (gt >= row_end) {  // a new row: flush the last one's histogram, load the query
            if (t >= 0 && count_keys) {
                named_barrier(bar_id, 128);
                flush_and_clear_histogram(hist_s, hist + (long long)t * kHistBins, ct);
                named_barrier(bar_id, 128);
            }
            if (t < 0) t = item_of_tile(start, T, gt);
            while (start[t + 1] <= gt) ++t;
            row_end = start[t + 1];
            n = visible_len(valid_lens, t, max_len);
            out = scores + (long long)t * ld;
            const unsigned short* r0 = q16 + ((long long)t * score_wgmma::kHeads + h0) * kRowHalves + 2 * c;
            const unsigned short* r1 = r0 + 8 * kRowHalves;
#pragma unroll
            for (int ks = 0; ks < kDim / 16; ++ks) {
                qa[ks][0] = *reinterpret_cast<const u32*>(r0 + 16 * ks);
                qa[ks][1] = *reinterpret_cast<const u32*>(r1 + 16 * ks);
                qa[ks][2] = *reinterpret_cast<const u32*>(r0 + 16 * ks + 8);
                qa[ks][3] = *reinterpret_cast<const u32*>(r1 + 16 * ks + 8);
            }
            w0 = w_scaled[(long long)t * score_wgmma::kHeads + h0];
            w1 = w_scaled[(long long)t * score_wgmma::kHeads + h0 + 8];
        }
        const int tile_start = (gt - start[t]) * kTile;
        const int s = j % kDecStages;
        mbar_wait(full + s, (u32)(j / kDecStages) & 1u);
        float acc[64];
        const u64 desc = wgmma_desc(smem + WsSmem::kDec + s * kDecBytes, kLbo, kSbo);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kDim / 16; ++ks)
            wgmma_m64n128k16(acc, qa[ks], desc + (u64)((2 * ks * kLbo) >> 4), ks > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_accumulators(acc);
        const float gscale = dec_gs[s * kTile + my_entry];
        mbar_arrive(empty + s);  // the stage is free for the producer

        // acc[4m + b]: head h0, entry 8m + 2c + b; acc[4m + 2 + b]: head h0 + 8, same entry
        float part[32];  // part[2m + b]: the two heads' weighted sum for entry 8m + 2c + b
#pragma unroll
        for (int m = 0; m < 16; ++m)
#pragma unroll
            for (int b = 0; b < 2; ++b)
                part[2 * m + b] = fmaf(w1, relu_nan(acc[4 * m + 2 + b]), w0 * relu_nan(acc[4 * m + b]));
        // sum over the 8 lanes of a column (g = lane bits 2..4), halving the values each step
        butterfly_step<16>(part, lane);
        butterfly_step<8>(part, lane);
        butterfly_step<4>(part, lane);
        float* rb = red + buf * (4 * kTile);
        *reinterpret_cast<float4*>(rb + warp * kTile + 4 * lane) = make_float4(part[0], part[1], part[2], part[3]);
        named_barrier(bar_id, 128);
        const float sum = (rb[ct] + rb[kTile + ct]) + (rb[2 * kTile + ct] + rb[3 * kTile + ct]);
        buf ^= 1;  // two buffers: the next tile's writes cannot overtake this tile's reads
        const int se = tile_start + my_entry;
        const float score = sum * gscale + 0.0f;  // -0 folded into +0
        out[se] = score;
        const u32 key = score_to_key(score);
        if (count_keys && se < n && key) atomicAdd(&hist_s[key >> 21], 1u);
    }
    if (t >= 0 && count_keys) {
        named_barrier(bar_id, 128);
        flush_and_clear_histogram(hist_s, hist + (long long)t * kHistBins, ct);
    }
}

// grid (G,), 384 threads, WsSmem::kBytes of dynamic shared memory, T <= kMaxBalancedRows.
// E a power of two with E * D/16 a multiple of 16, key_scale 16-byte aligned (BulkRing).
template <int kDim>
__global__ void __launch_bounds__(score_ws::kThreads, 1)
score_ws_kernel(const unsigned short* __restrict__ q16,  // [T, 64, kDim + 8] from prep_query_chunked_kernel<kDim>
                const float* __restrict__ w_scaled,      // [T, 64]
                const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                const u8* __restrict__ key_scale,        // [P, E, D/16]
                const float* __restrict__ key_gscale,    // [P]
                const int* __restrict__ block_table,     // [T, L]
                const int* __restrict__ valid_lens,      // [T]
                int T, int P, int E, int e_shift, int L,
                float* __restrict__ scores,              // [T, ld] workspace
                long long ld,
                u32* __restrict__ hist)                  // [T, kHistBins] or nullptr
{
    using namespace score_ws;
    static_assert(kDim == score_ws::kDim, "the warp-specialised kernel is written for D = 128");
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x;
    const int max_len = L * E;
    if (tid < kDecStages) {
        mbar_init(reinterpret_cast<u64*>(smem + WsSmem::kFull) + tid, 128);   // the producer's threads
        mbar_init(reinterpret_cast<u64*>(smem + WsSmem::kEmpty) + tid, 128);  // one consumer's threads
    }
    if (tid < kRingStages) mbar_init(reinterpret_cast<u64*>(smem + WsSmem::kRingBars) + tid, 128);
    mbar_init_fence();
    u32* hist_s = reinterpret_cast<u32*>(smem + WsSmem::kHist);
    for (int i = tid; i < 2 * kHistBins; i += kThreads) hist_s[i] = 0u;
    int* start = reinterpret_cast<int*>(smem + WsSmem::kSched);
    // start[r] = tiles of rows before r (its barriers also publish the inits above)
    const u32 total = tile_starts<score_wgmma::kMaxBalancedRows, kThreads>(
        T, [&](int row) { return (visible_len(valid_lens, row, max_len) + kTile - 1) / kTile; }, start,
        reinterpret_cast<u32*>(smem + WsSmem::kScratch));
    const long long G = gridDim.x;
    const int g0 = (int)((long long)total * blockIdx.x / G);
    const int g1 = (int)((long long)total * (blockIdx.x + 1) / G);
    if (g0 >= g1) return;
    if (tid >= 2 * 128)
        ws_produce(smem, start, T, g0, g1, keys_fp4, key_scale, key_gscale, block_table, valid_lens, P, E, e_shift, L);
    else
        ws_consume(smem, start, T, g0, g1, q16, w_scaled, valid_lens, max_len, scores, ld, hist);
}
