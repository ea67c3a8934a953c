// score_ws.cu: warp-specialised scoring on Hopper (sm_90a) for D = 128, H <= 64: the NVFP4
// decode runs in a warpgroup of its own, beside the warpgroup that drives the tensor cores.
//
// CTAs of two warpgroups, two per SM, the balanced schedule of score_wgmma.cu (the tiles of
// up to 1,024 rows, concatenated, cut into equal ranges, one per CTA):
//   * producer (warpgroup 1): loads its share of each 128-entry key tile straight from global
//     memory into registers one tile ahead (block ids two tiles ahead), decodes it to fp16
//     (e2m1 x e4m3, exact) into one of kDecStages shared-memory stages in wgmma's K-major
//     core-matrix layout (8 entries x 8 K-values per 128-byte core matrix; 128 bytes apart
//     along the entries, kLbo = 2048 along K) with the tile's global scales beside it, and
//     marks the stage full (an mbarrier);
//   * consumer (warpgroup 0): per tile two wgmma groups, m64n64k16 with both operands in
//     shared memory (A = 64 decoded entries, B = the query's 64 heads, staged once per row),
//     released as soon as both have run; the epilogue is score_wgmma.cu's (ReLU keeping NaN,
//     head weights, the sum over the heads in the thread and its quad, the block's global
//     scale, the score store, the histogram count).
// The producer needs no barrier of its own and never waits on the tensor cores; the two
// CTAs of an SM overlap one's epilogue with the other's MMAs.
// K order: slot 8*kc + i of k-chunk kc holds dim 8*kc + (i with bits 0 and 1 swapped): the
// order in which the E4M3 conversion emits the eight codes of a 32-bit word (see
// e2m1x8_to_f16x2_cvt); the consumer stages the query in the same order
// (QueryStaging::store_chunked).
// Output: score_wgmma.cu's (scores of every entry of each touched tile, histogram of the
// keys' top 11 bits of the visible ones), the same fp16 products summed in another K order.
#include "wgmma_common.cuh"

namespace score_ws {
constexpr int kDim = 128;                      // the head dim this kernel takes
constexpr int kTile = 128;                     // entries per tile
constexpr int kThreads = 256;                  // consumer warpgroup, producer warpgroup
constexpr int kDecStages = 2;                  // decoded fp16 tiles in flight per CTA
constexpr int kDecBytes = kTile * kDim * 2;    // one decoded stage: 32 KB
constexpr int kLbo = (kTile / 8) * 128;        // stage: bytes between core matrices along K
// query: bytes between core matrices along K, padded by 32 bytes so that the staging's
// stores of four consecutive K chunks fall on distinct banks (QueryStaging::store_chunked, v52)
constexpr int kQLbo = (64 / 8) * 128 + 32;
constexpr int kConsumerBarrier = 1;            // named barrier of the consumer warpgroup
constexpr int kHistBins = score_mma::kHistBins;
}  // namespace score_ws

struct WsSmem {
    static constexpr int kDec = 0;                                                     // [kDecStages][32 KB]
    static constexpr int kQuery = kDec + score_ws::kDecStages * score_ws::kDecBytes;   // B: [16][8][8 heads][16 B]
    static constexpr int kW = kQuery + (score_ws::kDim / 8) * score_ws::kQLbo;         // float[64]: scaled weights
    static constexpr int kDecGs = kW + 64 * 4;                                         // float[kDecStages][128]
    static constexpr int kFull = kDecGs + score_ws::kDecStages * score_ws::kTile * 4;
    static constexpr int kEmpty = kFull + score_ws::kDecStages * 8;
    static constexpr int kHist = kEmpty + score_ws::kDecStages * 8;                    // u32[kHistBins]
    static constexpr int kSched = kHist + score_ws::kHistBins * 4;                     // int[kMaxBalancedRows + 1]
    static constexpr int kRowLen = kSched + (score_wgmma::kMaxBalancedRows + 1) * 4;   // int[kMaxBalancedRows]
    static constexpr int kScratch = kRowLen + score_wgmma::kMaxBalancedRows * 4;       // u32[32]
    static constexpr int kBytes = kScratch + 32 * 4;
    static_assert(kQuery % 128 == 0 && kFull % 8 == 0, "operand and barrier alignment");
};

// A tile of the concatenated rows: its row (< 0: none) and the row's entry it starts at.
struct WsTile {
    int row, first;
};

// My four 16-byte code chunks of one tile, their two scale bytes and their blocks' global
// scales, in flight from global memory.
struct WsLoads {
    uint4 code[4];
    u32 scale2[4];
    float gscale[4];
};

// Producer warpgroup: every tile of this CTA's range [g0, g1), in order, decoded into stage
// k % kDecStages (k = the tile's position in the range).
__device__ __forceinline__ void ws_produce(unsigned char* smem, const int* start, int g0, int g1,
                                           const u8* __restrict__ keys_fp4, const u8* __restrict__ key_scale,
                                           const float* __restrict__ key_gscale, const int* __restrict__ block_table,
                                           const int* row_len, int P, int E, int e_shift, int L) {
    using namespace score_ws;
    constexpr int kCodeBytes = kDim / 2, kScaleBytes = kDim / 16;
    const int p = threadIdx.x - 128, lane = p & 31, pw = p >> 5;
    u64* full = reinterpret_cast<u64*>(smem + WsSmem::kFull);
    u64* empty = reinterpret_cast<u64*>(smem + WsSmem::kEmpty);
    float* dec_gs = reinterpret_cast<float*>(smem + WsSmem::kDecGs);
    // My units of a tile: the 16-byte code chunk q (dims 32q .. 32q + 31) of entries
    // entry(i) = 8 * (pw + 4i) + (lane & 7), i = 0..3. Each quarter-warp covers 8 consecutive
    // entries, two lanes per chunk: its global loads are 512 contiguous bytes a warp (within
    // a block) and its decoded stores ((entry & 7) * 16 within a 128-byte core-matrix row)
    // are free of bank conflicts.
    const int q = (((lane & 7) >> 1) + (lane >> 3)) & 3;
    auto entry = [&](int i) { return 8 * (pw + 4 * i) + (lane & 7); };

    // the row of the tiles being looked up (rows are visited in order), its first tile, its
    // end in the concatenation, its block table and visible length (loaded once per row)
    int ref_row = -1, ref_begin = 0, ref_end = 0, ref_n = 0;
    const int* ref_bt = block_table;
    auto tile_ref = [&](int k) {
        WsTile r{-1, 0};
        const int g = g0 + k;
        if (g >= g1) return r;
        if (g >= ref_end) {
            int t = ref_row < 0 ? 0 : ref_row;
            while (start[t + 1] <= g) ++t;
            ref_row = t;
            ref_begin = start[t];
            ref_end = start[t + 1];
            ref_n = row_len[t];
            ref_bt = block_table + (long long)t * L;
        }
        r.row = ref_row;
        r.first = (g - ref_begin) * kTile;
        return r;
    };
    // block ids of my entries of the tile just looked up (-1: not visible; E is a power of
    // two); range-checked where used, so that nothing waits on these loads for a tile
    auto block_ids = [&](const WsTile& r, int (&blk)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int s = r.first + entry(i);
            blk[i] = (r.row >= 0 && s < ref_n) ? ref_bt[s >> e_shift] : -1;
        }
    };
    // Entries of unusable blocks (out of range, or past the row's end) load nothing: their
    // registers keep an earlier tile's codes, and their global scale is NaN, so their scores
    // are NaN (never selected) or lie past the row's end (never read).
    auto issue_loads = [&](const WsTile& r, const int (&blk)[4], WsLoads& x) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int b = blk[i];
            const bool ok = (u32)b < (u32)P;
            const u32 ent = (u32)b * (u32)E + (u32)((r.first + entry(i)) & (E - 1));  // < P * E < 2^31
            if (ok) {
                x.code[i] = *reinterpret_cast<const uint4*>(keys_fp4 + (size_t)ent * kCodeBytes + 16 * q);
                x.scale2[i] = *reinterpret_cast<const unsigned short*>(key_scale + (size_t)ent * kScaleBytes + 2 * q);
            }
            x.gscale[i] = ok && q == 0 ? key_gscale[b] : __int_as_float(0x7fc00000);
        }
    };
    auto decode = [&](const WsLoads& x, int s) {
        unsigned char* dst = smem + WsSmem::kDec + s * kDecBytes;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int e = entry(i);
            const u32 sv = scales_to_f16x2<score_wgmma::kScaleMul>(x.scale2[i]);  // groups 2q, 2q + 1
            const u32 words[4] = {x.code[i].x, x.code[i].y, x.code[i].z, x.code[i].w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                u32 d[4];
                e2m1x8_to_f16x2_cvt(words[w], d);  // dims 8kc + {0,2}, {1,3}, {4,6}, {5,7}
                const u32 sc = w < 2 ? splat_lo(sv) : splat_hi(sv);
                const int kc = 4 * q + w;
                *reinterpret_cast<uint4*>(dst + kc * kLbo + (e >> 3) * 128 + (e & 7) * 16) =
                    make_uint4(hmul2(d[0], sc), hmul2(d[1], sc), hmul2(d[2], sc), hmul2(d[3], sc));
            }
            if (q == 0) dec_gs[s * kTile + e] = x.gscale[i];
        }
    };

    const int num = g1 - g0;
    WsLoads a, b;
    int blk[4];
    WsTile next = tile_ref(0);
    block_ids(next, blk);
    issue_loads(next, blk, a);  // tile 0
    next = tile_ref(1);
    block_ids(next, blk);       // tile 1
    // tile k: issue the loads of tile k + 1 (block ids looked up one tile earlier), look up
    // the block ids of tile k + 2, then decode tile k (loaded one tile earlier)
    auto step = [&](int k, const WsLoads& cur, WsLoads& nxt) {
        issue_loads(next, blk, nxt);
        next = tile_ref(k + 2);
        block_ids(next, blk);
        const int s = k % kDecStages;
        if (k >= kDecStages) mbar_wait(empty + s, (u32)((k / kDecStages) + 1) & 1u);
        decode(cur, s);
        fence_proxy_async();  // the stage, written through the generic proxy, is read by wgmma
        mbar_arrive(full + s);
    };
    for (int k = 0; k < num; k += 2) {  // two tiles a trip: the load sets swap roles without copies
        step(k, a, b);
        if (k + 1 < num) step(k + 1, b, a);
    }
}

// Consumer warpgroup: the MMAs and the epilogue of every tile of [g0, g1).
template <class QT>
__device__ __forceinline__ void ws_consume(unsigned char* smem, const int* start, int g0, int g1,
                                           const QT* __restrict__ q, const float* __restrict__ w, int H,
                                           const int* row_len,
                                           float* __restrict__ scores, long long ld, u32* __restrict__ hist) {
    using namespace score_ws;
    constexpr int kSubTile = score_wgmma::kSubTile;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    u64* full = reinterpret_cast<u64*>(smem + WsSmem::kFull);
    u64* empty = reinterpret_cast<u64*>(smem + WsSmem::kEmpty);
    const float* dec_gs = reinterpret_cast<const float*>(smem + WsSmem::kDecGs);
    unsigned char* qb = smem + WsSmem::kQuery;
    float* wsm = reinterpret_cast<float*>(smem + WsSmem::kW);
    u32* hist_s = reinterpret_cast<u32*>(smem + WsSmem::kHist);
    const bool count_keys = hist != nullptr;
    const u64 desc_q = wgmma_desc(qb, kQLbo, 128);
    const int r0 = 16 * warp + g;  // my rows of a sub-tile: r0 and r0 + 8

    const u64 desc_dec = wgmma_desc(smem + WsSmem::kDec, kLbo, 128);  // stage 0, sub-tile 0, k-step 0
    int t = -1, n = 0, row_end = 0;
    float* out = scores;
    float acc[2][32];
    // add the consumer's histogram to row t's and zero it (after a barrier: every count done)
    auto flush_histogram = [&]() {
        named_barrier(kConsumerBarrier, 128);
        for (int i = tid; i < kHistBins; i += 128) {
            const u32 v = hist_s[i];
            if (v) {
                atomicAdd(&hist[(long long)t * kHistBins + i], v);
                hist_s[i] = 0u;
            }
        }
    };
    float2 wpair[8];  // the weights of my heads 8j + 2c, + 1
    auto epilogue = [&](const float (&d)[32], int s0, float g0_, float g1_) {
        const float mine = weighted_head_sum_mine(d, wpair, c);  // row r0 + 8 (c & 1)
        if (c < 2) {  // lane c = 0 stores row r0, lane c = 1 row r0 + 8
            const int se = s0 + 8 * c;
            const float score = mine * (c ? g1_ : g0_) + 0.0f;  // -0 folded into +0
            out[se] = score;
            const u32 key = score_to_key(score);
            if (count_keys && se < n && key) atomicAdd(&hist_s[key >> 21], 1u);
        }
    };
    // tile k in stage s (a constant at each call: the descriptors fold to uniform values)
    auto tile = [&](int k, int s) {
        const int gt = g0 + k;
        if (gt >= row_end) {  // a new row: flush the last one's histogram, stage the query
            if (t >= 0) {
                if (count_keys)
                    flush_histogram();
                else
                    named_barrier(kConsumerBarrier, 128);  // every MMA of the last row done
            }
            t = t < 0 ? 0 : t;
            while (start[t + 1] <= gt) ++t;
            row_end = start[t + 1];
            n = row_len[t];
            out = scores + (long long)t * ld;
            {  // the query in the decode's K order, by whole lines (QueryStaging::store_chunked)
                QueryStaging<kDim> staging;
                staging.load(q, w, H, t);
                staging.store_chunked(qb, wsm, kQLbo);
            }
            fence_proxy_async();  // the query, written through the generic proxy, is read by wgmma
            named_barrier(kConsumerBarrier, 128);
#pragma unroll
            for (int j = 0; j < 8; ++j) wpair[j] = *reinterpret_cast<const float2*>(wsm + 8 * j + 2 * c);
        }
        const int tile_start = (gt - start[t]) * kTile;
        mbar_wait(full + s, (u32)(k / kDecStages) & 1u);
#pragma unroll
        for (int u = 0; u < 2; ++u) {  // sub-tile u: entries 64u .. 64u + 63 (8 core-matrix rows)
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < kDim / 16; ++ks)
                wgmma_m64n64k16_ss(acc[u], desc_dec + (u64)((s * kDecBytes + u * (kSubTile / 8) * 128 + 2 * ks * kLbo) >> 4),
                                   desc_q + (u64)((2 * ks * kQLbo) >> 4), ks > 0);
            wgmma_commit();
        }
        const float* gs = dec_gs + s * kTile;
        const float ga0 = gs[r0], ga1 = gs[r0 + 8], gb0 = gs[kSubTile + r0], gb1 = gs[kSubTile + r0 + 8];
        wgmma_wait<1>();
        fence_accumulators(acc[0]);
        epilogue(acc[0], tile_start + r0, ga0, ga1);
        wgmma_wait<0>();
        fence_accumulators(acc[1]);
        mbar_arrive(empty + s);  // the stage is free for the producer
        epilogue(acc[1], tile_start + kSubTile + r0, gb0, gb1);
    };
    static_assert(kDecStages == 2, "tiles run in pairs, one per stage");
    for (int k = 0; g0 + k < g1; k += 2) {
        tile(k, 0);
        if (g0 + k + 1 < g1) tile(k + 1, 1);
    }
    let_next_grid_start();  // the filter may be placed while the last CTAs flush (common.cuh)
    if (t >= 0 && count_keys) flush_histogram();
}

// grid (G,), 256 threads, WsSmem::kBytes of dynamic shared memory (two CTAs per SM),
// T <= kMaxBalancedRows; keys_fp4 16-byte and key_scale 2-byte aligned.
template <int kDim, class QT = float>
__global__ void __launch_bounds__(score_ws::kThreads, 2)
score_ws_kernel(const QT* __restrict__ q,                // [T, H, kDim] (float, half_bits, bf16_bits or e4m3_bits): staged here
                const float* __restrict__ w,             // [T, H]
                int H,                                   // H <= 64
                const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                const u8* __restrict__ key_scale,        // [P, E, D/16]
                const float* __restrict__ key_gscale,    // [P]
                const int* __restrict__ block_table,     // [T, L]
                const int* __restrict__ valid_lens,      // [T]
                int T, int P, int E, int e_shift, int L,
                float* __restrict__ scores,              // [T, ld] workspace
                long long ld,
                u32* __restrict__ hist,                  // [T, kHistBins] or nullptr
                u32* __restrict__ count)                 // [T] candidate counts, cleared here, or nullptr
{
    clear_candidate_counts(count, T);
    using namespace score_ws;
    static_assert(kDim == score_ws::kDim, "the warp-specialised kernel is written for D = 128");
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x;
    const int max_len = L * E;
    if (tid < kDecStages) {
        mbar_init(reinterpret_cast<u64*>(smem + WsSmem::kFull) + tid, 128);   // the producer's threads
        mbar_init(reinterpret_cast<u64*>(smem + WsSmem::kEmpty) + tid, 128);  // the consumer's threads
    }
    mbar_init_fence();
    u32* hist_s = reinterpret_cast<u32*>(smem + WsSmem::kHist);
    for (int i = tid; i < kHistBins; i += kThreads) hist_s[i] = 0u;
    int* start = reinterpret_cast<int*>(smem + WsSmem::kSched);
    // start[r] = tiles of rows before r (its barriers also publish the inits above)
    // and row_len[r] = its visible length, so that no role waits on valid_lens again
    int* row_len = reinterpret_cast<int*>(smem + WsSmem::kRowLen);
    const u32 total = tile_starts<score_wgmma::kMaxBalancedRows, kThreads>(
        T,
        [&](int row) {
            const int n = visible_len(valid_lens, row, max_len);
            row_len[row] = n;
            return (n + kTile - 1) / kTile;
        },
        start, reinterpret_cast<u32*>(smem + WsSmem::kScratch));
    const long long G = gridDim.x;
    const int g0 = (int)((long long)total * blockIdx.x / G);
    const int g1 = (int)((long long)total * (blockIdx.x + 1) / G);
    if (g0 >= g1) return;
    if (tid >= 128)
        ws_produce(smem, start, g0, g1, keys_fp4, key_scale, key_gscale, block_table, row_len, P, E, e_shift, L);
    else
        ws_consume(smem, start, g0, g1, q, w, H, row_len, scores, ld, hist);
}
