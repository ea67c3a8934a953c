// score_wgmma.cu: the fast scoring path on Hopper's warpgroup MMA (wgmma, sm_90a).
//
// Same contract and workspace as score_mma.cu, for H <= 64 and D <= 128. One warpgroup (4
// warps) per CTA computes 64 entries x 64 heads per wgmma.m64n64k16:
//   * A = keys, decoded from NVFP4 into registers with the same fragment layout and K
//     permutation as for mma.sync (the wgmma A fragment of each warp is the m16n8k16 one),
//     through the hardware E4M3 conversion; two 64-entry sub-tiles with their own
//     accumulators in flight: the first's MMAs overlap the second's decode (the SM's other
//     CTAs cover the rest: docs/performance.md v67-v68);
//   * B = the query, in shared memory in wgmma's K-major core-matrix layout (8 heads x 8
//     K-values per 128-byte core matrix; core matrices 128 bytes apart along the heads,
//     1024 bytes apart along K), in the same permuted K order as the decode;
//   * accumulators (2 x 32 floats a thread) read by the epilogue once both sub-tiles are done.
// Keys stream through BulkRing (wgmma_common.cuh); the epilogue is score_mma.cu's.
#include "wgmma_common.cuh"

template <int kDim>
struct WgmmaSmem {
    static constexpr int kQBytes = (kDim / 8) * score_wgmma::kLbo;  // B in core-matrix layout
    static constexpr int kW = kQBytes;                               // float[64]
    static constexpr int kRing = kW + 64 * 4;                        // BulkRing stages (128-aligned)
    static constexpr int kMeta = kRing + score_wgmma::kStages * BulkRing<kDim>::kStageBytes;
    static constexpr int kBars = kMeta + score_wgmma::kStages * score_wgmma::kTile * 4;
    static constexpr int kQBar = kBars + score_wgmma::kStages * 8;  // u64: the query image landed
    static constexpr int kHist = kQBar + 8;
    // u32[kHistBins + 1]: bin kHistBins counts what the histogram leaves out (never read)
    static constexpr int kSched = kHist + score_mma::kHistBins * 4 + 16;  // int[kMaxBalancedRows + 1]
    static constexpr int kScratch = kSched + (score_wgmma::kMaxBalancedRows + 1) * 4;  // u32[32]
    static constexpr int kRot = kScratch + 32 * 4;  // int: issue_rotation; then u32[3]: ShareClaims::mine
    static constexpr int kBytes = kRot + 16;
};

// The query image of score_wgmma_kernel (kStagedRows = false): what its shared memory holds
// of a query from byte 0, so that one bulk copy a segment brings it: B in the core-matrix
// layout (WgmmaSmem::kQBytes), then the 64 weights in head order (WgmmaSmem::kW), halved
// where both wgmma kernels' epilogues take 2 ReLU(x) (the heads of score_wgmma::fma_relu_head);
// the pair kernel copies each query's image in K chunks of kLbo bytes into its two-query B.
// prep_query_row's values (the same bits as the staged rows and the kernel's own halving, or
// as the pair kernel's own staging, QueryStaging::store<true>), written by wgmma_prep_kernel.
template <int kDim>
struct PrepToWgmmaImage {
    static constexpr int kBytes = WgmmaSmem<kDim>::kW + score_wgmma::kHeads * 4;  // a multiple of 16
    static constexpr int kPairs = kDim / 2;  // no padding slots
    unsigned char* __restrict__ qimg;        // [T][kBytes]
    __device__ __forceinline__ void pair(int t, int h, int pr, u32 v) const {
        using namespace score_wgmma;
        *reinterpret_cast<u32*>(qimg + (long long)t * kBytes + (pr / 4) * kLbo + (h / 8) * kCoreBytes + (h % 8) * 16 +
                                (pr % 4) * 4) = v;
    }
    __device__ __forceinline__ void weight(int t, int h, float v) const {
        reinterpret_cast<float*>(qimg + (long long)t * kBytes + WgmmaSmem<kDim>::kW)[h] =
            score_wgmma::fma_relu_head(h) ? 0.5f * v : v;
    }
};

// q [T, H, kDim] and w [T, H] float32 -> qimg [T][PrepToWgmmaImage<kDim>::kBytes]: the query
// staging of prep_query_kernel (the same fp16 values), written as the wgmma kernels' query
// images (score_wgmma_kernel's and score_wgmma_pairs_kernel's). grid (T, 64 / 16), 256 threads.
template <int kDim, class QT = float>  // q: float, half_bits, bf16_bits or e4m3_bits (common.cuh)
__global__ void __launch_bounds__(256) wgmma_prep_kernel(const QT* __restrict__ q, const float* __restrict__ w, int H,
                                                         unsigned char* __restrict__ qimg) {
    // the scoring kernel after this one, launched programmatically in graphs, may be placed
    // now: it schedules its tiles and starts its key copies, then waits for this grid
    let_next_grid_start();
    prep_query_row<kDim, score_wgmma::kHeads / 8>(q, w, H, PrepToWgmmaImage<kDim>{qimg});
}

// Score one segment of one row: tiles first_tile .. first_tile + num_tiles - 1 of row t
// (num_tiles > 0). Ring slots continue from jbase (the tiles this CTA scored before).
// The query: kStagedRows, from prep_query_kernel's rows (q16 [T, 64, kDim + 8], w_scaled
// [T, 64]) by 1,024 16-byte copies; else from wgmma_prep_kernel's image (q16 taken as qimg
// [T][PrepToWgmmaImage<kDim>::kBytes], w_scaled unused) by one bulk copy, whose barrier
// completes phase `seg` & 1 (seg: the CTA's segments before this one).
// next_row: the row of the CTA's next segment where it is known (the same claim), else -1:
// its first tiles' keys are asked of L2 here (prefetch_row_start_l2).
template <int kDim, bool kStagedRows>
__device__ __forceinline__ void score_segment(
    unsigned char* smem, const unsigned short* __restrict__ q16, const float* __restrict__ w_scaled,
    const u8* __restrict__ keys_fp4, const u8* __restrict__ key_scale, const float* __restrict__ key_gscale,
    const int* __restrict__ block_table, int t, int n, int first_tile, int num_tiles, int jbase, int P, int E,
    int e_shift, int L, float* __restrict__ scores, long long ld, u32* __restrict__ hist, int rot, int next_row,
    int next_n, int seg) {
    using namespace score_wgmma;
    using Smem = WgmmaSmem<kDim>;
    constexpr int kKSteps = kDim / 16;
    constexpr int kRowHalves = kDim + 8;  // row of q16 in global memory
    constexpr int kThreads = 128;
    constexpr int kHistBins = score_mma::kHistBins;
    unsigned char* qb = smem;  // [D/8][8][8 heads][16 B]
    float* wsm = reinterpret_cast<float*>(smem + Smem::kW);
    u32* hist_s = reinterpret_cast<u32*>(smem + Smem::kHist);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    BulkRing<kDim> keys;
    keys.ring = smem + Smem::kRing;
    keys.meta_gs = reinterpret_cast<float*>(smem + Smem::kMeta);
    keys.bars = reinterpret_cast<u64*>(smem + Smem::kBars);
    keys.keys_fp4 = keys_fp4; keys.key_scale = key_scale; keys.key_gscale = key_gscale;
    keys.bt = block_table + (long long)t * L;
    keys.P = P; keys.E = E; keys.e_shift = e_shift; keys.n = n;
    keys.first_tile = first_tile; keys.num_tiles = num_tiles; keys.jbase = jbase;
    keys.row_shift = e_shift < 7 ? e_shift : 7;
    keys.copies = kTile >> keys.row_shift;
    keys.rot = rot;

    // ---- prologue: histogram, the first tiles' block ids, the first tile's copies and the
    // global scales' loads, then the query into the core-matrix layout and the weights, then the
    // other first tiles' copies (at a wave's start every CTA's first tiles leave at once, ~11 MB
    // from HBM: the query's copies, L2 hits, go out before the second and third tiles rather
    // than behind them; docs/performance.md v72), the scales stored before the barrier (no copy
    // waits for a scale: BulkRing's start in steps, v73). In a graph this kernel may start while
    // prep_query_kernel runs (it is launched programmatically after it): everything before the
    // wait touches nothing that kernel writes, and every kernel before it has ended (it was
    // launched normally).
    TIMELINE_POINT(14, jbase > 0);  // points 14-15: a restart's segment entered, its block ids' loads issued
    for (int i = tid; i < kHistBins; i += kThreads) hist_s[i] = 0u;
    int b_first[kStages - 1];
    float g_first[kStages - 1];
    keys.start_ids(tid, b_first);
    TIMELINE_POINT(15, jbase > 0);
    keys.start_copies(tid, 0, 1, b_first);
    keys.start_scale_loads(b_first, g_first);
    TIMELINE_POINT(2, jbase == 0);  // points 2-6: the CTA's first segment (scripts/probe_timeline.py)
    TIMELINE_POINT(12, jbase > 0);  // points 12-13 as 2 and 4, after a restart
    wait_for_previous_grid();  // q16 and w_scaled written (a no-op from the first segment on)
    TIMELINE_POINT(3, jbase == 0);
    if constexpr (kStagedRows) {
        const unsigned short* qsrc = q16 + (long long)t * kHeads * kRowHalves;
        for (int i = tid; i < kHeads * (kDim / 8); i += kThreads) {
            const int h = i / (kDim / 8), kc = i % (kDim / 8);
            cp_async_16(qb + kc * kLbo + (h / 8) * kCoreBytes + (h % 8) * 16, qsrc + h * kRowHalves + kc * 8, true);
        }
        // the weights by 16-byte asynchronous copies too: a plain load would hold this thread
        // (and the first tiles' copies in keys.start) for a global round trip
        if (tid < kHeads / 4) cp_async_16(wsm + 4 * tid, w_scaled + (long long)t * kHeads + 4 * tid, true);
        cp_async_commit();
    } else if (tid == 0) {  // the query image, B and weights, by one bulk copy
        constexpr u32 kImage = PrepToWgmmaImage<kDim>::kBytes;
        const u32 qbar = smem_u32(smem + Smem::kQBar);
        // the last segment's reads of B and the weights are behind the barriers at its end
        fence_proxy_async();
        mbar_arrive_expect_tx(qbar, kImage);
        bulk_copy_g2s(smem_u32(qb), reinterpret_cast<const unsigned char*>(q16) + (long long)t * kImage, kImage, qbar);
    }
    keys.start_copies(tid, 1, kStages - 1, b_first);
    TIMELINE_POINT(4, jbase == 0);
    TIMELINE_POINT(13, jbase > 0);
    // the next segment's first tiles towards L2, by the last warp, while the query lands
    if (next_row >= 0 && warp == 3)
        prefetch_row_start_l2<kDim>(block_table + (long long)next_row * L, L, next_n, (kStages - 1) * kTile, P, E,
                                    e_shift, keys_fp4, key_scale, key_gscale, lane);
    keys.store_start_scales(tid, g_first);
    if constexpr (kStagedRows) {
        cp_async_wait<0>();
        // my four weights (one head group's) halved where the epilogue takes 2 ReLU(x)
        if (tid < kHeads / 4 && score_wgmma::fma_relu_head(4 * tid)) {
            float4* my_w = reinterpret_cast<float4*>(wsm + 4 * tid);
            const float4 v = *my_w;
            *my_w = make_float4(0.5f * v.x, 0.5f * v.y, 0.5f * v.z, 0.5f * v.w);
        }
        fence_proxy_async();  // the query, written through the generic proxy, is read by wgmma
    } else {
        mbar_wait(smem_u32(smem + Smem::kQBar), (u32)seg & 1u);  // the image landed (async proxy, as wgmma)
    }
    __syncthreads();
    TIMELINE_POINT(5, jbase == 0);
    TIMELINE_POINT(10, jbase > 0);  // points 10-11: the CTA's last segment after a restart

    const int g = lane >> 2, c = lane & 3;
    // the row's base, broadcast so that ptxas knows it warp-uniform: made once, where from t
    // and ld it was made again each tile (6 instructions; docs/performance.md v70)
    float* const out = reinterpret_cast<float*>(
        __shfl_sync(~0u, reinterpret_cast<unsigned long long>(scores + (long long)t * ld), 0));
    // the query's descriptor for k-step 0; k-step ks starts 2 * ks * kLbo bytes further (the
    // address field, bytes / 16, cannot carry: shared memory is below 256 KB)
    const u64 desc_q = wgmma_desc(qb, kLbo, kCoreBytes);
    // Sub-tile u of a tile accumulates into acc[u] from a_frag[u]: both sub-tiles' MMAs are
    // in flight at once, so sub-tile 0's MMAs overlap sub-tile 1's decode; the epilogue
    // reads both once both are done.
    u32 a_frag[2][kKSteps][4];
    float acc[2][32];
    // The weighted head sums of a finished tile, rows r0 and r0 + 8 of both sub-tiles
    // (entries s0, s0 + 8, s0 + 64, s0 + 72; gs0, gs1: the global scales of my row, r0 + 8 (c & 1),
    // in sub-tiles 0 and 1): the weights loaded once for both, and the two sums' dependent
    // FMA chains side by side, after both sub-tiles' MMAs (docs/performance.md v67: one
    // epilogue a sub-tile, the first under the second sub-tile's MMAs, was 1.4% slower).
    auto epilogue = [&](int s0, float gs0, float gs1) {
        float2 wv[8];  // heads 8j + 2c, + 1
#pragma unroll
        for (int j = 0; j < 8; ++j) wv[j] = *reinterpret_cast<const float2*>(wsm + 8 * j + 2 * c);
        auto weights = [&](int j) { return wv[j]; };
        // row r0 + 8 (c & 1); half the heads' ReLU on the FMA pipe
        const float mine0 = weighted_head_sum_mine_of<kFmaReluGroups>(acc[0], weights, c);
        const float mine1 = weighted_head_sum_mine_of<kFmaReluGroups>(acc[1], weights, c);
        // lanes c and c ^ 2 hold the same sums: lane c = 0 stores row r0 of sub-tile 0, lane
        // 1 its row r0 + 8, lanes 2 and 3 those of sub-tile 1 (one store and one count a lane)
        const bool second = c >= 2;
        const int s = s0 + 8 * (c & 1) + (second ? kSubTile : 0);
        // an exact -0 product folded into +0 by the fused add of +0 (one rounding, as the
        // product's); a negative product that -ftz flushes still stores -0 (below)
        const float score = second ? fmaf(mine1, gs1, 0.0f) : fmaf(mine0, gs0, 0.0f);
        store_global(out + s, score);  // st.global: through the shuffle, out lost its space
        // counted whether or not a histogram is wanted (flushed only where one is): no
        // pointer test here (a register for the test brought back a special-register read
        // of the lane in the loop, slower: docs/performance.md v65); a raw bin maps to its
        // key's bin (flush_raw_histogram), but for -0 (a flushed negative product), counted
        // one bin below +0's where the select ranks it: that can only lower the threshold
        // bin, so the select takes more candidates, never fewer; NaN is the one score
        // left out (the entries left out go to a spare bin: a select, where a branch around
        // the count took three control instructions)
        atomicAdd(&hist_s[s < n && score == score ? raw_bin_of_plus_zero(score) : (u32)kHistBins], 1u);
    };

    // my rows' global scales within a slot, sub-tiles 0 and 1 (one load each a tile, no select)
    const u32 gs_row0 = keys.gscale_offset(16 * warp + g + 8 * (c & 1));
    const u32 gs_row1 = keys.gscale_offset(kSubTile + 16 * warp + g + 8 * (c & 1));
    for (int it = 0; it < num_tiles; ++it) {
        keys.begin_tile(it, tid);
        TIMELINE_POINT(6, jbase == 0 && it == 0);
        TIMELINE_POINT(11, jbase > 0 && it == 0);
        const unsigned char* st = keys.stage(it);
        const int tile_start = (first_tile + it) * kTile;
        // No MMA stays in flight across iterations: ptxas serialises every wgmma when
        // accumulators are read in a pipeline stage crossing the loop's back edge; the
        // other CTAs on the SM fill the tensor pipe in the gap.
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            decode_sub_tile<kDim>(st, u * kSubTile + 16 * warp + g, c, a_frag[u]);  // sub-tile u
            mma_sub_tile<kDim>(acc[u], a_frag[u], desc_q);
        }
        keys.refill_after_mma(it, tid);
        const int r0 = 16 * warp + g;
        const float gs0 = keys.gscale_at(it, gs_row0), gs1 = keys.gscale_at(it, gs_row1);  // before the wait
        keys.end_reads();
        wgmma_wait<0>();
        fence_accumulators(acc[0]);
        fence_accumulators(acc[1]);
        epilogue(tile_start + r0, gs0, gs1);
    }
    TIMELINE_POINT(8, next_row >= 0);  // points 8-9: the end of a segment the claim runs on past
    __syncthreads();  // histogram complete; every stage read (the next segment refills them)
    if (hist != nullptr) flush_raw_histogram(hist_s, hist + (long long)t * kHistBins, tid, kThreads);
    __syncthreads();
    TIMELINE_POINT(9, next_row >= 0);
}

// Two schedules, one kernel:
//   * balanced (grid (G,)): the tiles of all rows, concatenated, are cut into G ranges, one
//     per CTA, claimed from two counters in sizes by the CTA's slot on its SM (ShareClaims,
//     wgmma_common.cuh; without counters, G nearly equal ranges); a range may span several
//     rows (a segment per row). Ragged batches and single long rows keep every SM busy.
//     Needs T <= kMaxBalancedRows.
//   * per row (grid (T, chunks)): CTA (t, y) scores tiles y * tiles_per_cta .. of row t.
// E must be a power of two with E * D/16 a multiple of 16 (bulk copies of whole block runs);
// key_scale 16-byte aligned. The launcher checks both.
template <int kDim, bool kStagedRows = false>
__global__ void __launch_bounds__(128, 3)
score_wgmma_kernel(const unsigned short* __restrict__ q16,  // kStagedRows: [T, 64, kDim + 8] from prep_query_kernel<kDim, 8>;
                                                            // else the images [T][PrepToWgmmaImage<kDim>::kBytes] from wgmma_prep_kernel
                   const float* __restrict__ w_scaled,      // kStagedRows: [T, 64]; else unused
                   const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                   const u8* __restrict__ key_scale,        // [P, E, D/16]
                   const float* __restrict__ key_gscale,    // [P]
                   const int* __restrict__ block_table,     // [T, L]
                   const int* __restrict__ valid_lens,      // [T]
                   int T, int P, int E, int e_shift, int L, int tiles_per_cta, int balanced,
                   float* __restrict__ scores,              // [T, ld] workspace
                   long long ld,
                   u32* __restrict__ hist,                  // [T, kHistBins] or nullptr
                   u32* __restrict__ count,                 // [T] candidate counts, cleared here, or nullptr
                   u32* __restrict__ claims)                // [2] ShareClaims' counters (balanced), or nullptr: equal shares
{
    TIMELINE_POINT(0, true);  // the CTA's entry
    clear_candidate_counts(count, T);
    using namespace score_wgmma;
    using Smem = WgmmaSmem<kDim>;
    static_assert(kDim % 32 == 0 && kDim >= 32 && kDim <= 128, "D must be a multiple of 32 in [32, 128]");
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x;
    const int max_len = L * E;
    auto visible = [&](int row) { return visible_len(valid_lens, row, max_len); };

    u64* bars = reinterpret_cast<u64*>(smem + Smem::kBars);
    if (tid < kStages) mbar_init(bars + tid, ring_arrivals(e_shift));
    if (tid == kStages) mbar_init(reinterpret_cast<u64*>(smem + Smem::kQBar), 1);  // the query image's (one arrival a segment)
    if (tid == 0) *reinterpret_cast<int*>(smem + Smem::kRot) = issue_rotation();
    mbar_init_fence();

    int* start = reinterpret_cast<int*>(smem + Smem::kSched);
    // the balanced schedule's share claimed first: issued before the schedule is built (its
    // round trip under the row lengths' loads), read after tile_starts' barriers
    const ShareClaims share{claims, reinterpret_cast<u32*>(smem + Smem::kRot + 4), {1110u, 1042u, 920u}};
    int t = blockIdx.x, seg_first = 0, seg_num = 0, g = 0, g_end = 0;
    // the first segment of the CTA's next claim that holds tiles: [g, g_end) of all rows'
    // tiles in order; false once the wave is done
    auto take_claim = [&]() {
        while (share.tiles(g, g_end)) {
            if (g < g_end) {
                t = item_of_tile(start, T, g);
                seg_first = g - start[t];
                seg_num = min(g_end, start[t + 1]) - g;
                return true;
            }
            __syncthreads();  // every thread has read the claim
            share.claim();
            __syncthreads();
        }
        return false;
    };
    if (!balanced) {
        seg_first = blockIdx.y * tiles_per_cta;
        seg_num = min(seg_first + tiles_per_cta, (visible(t) + kTile - 1) / kTile) - seg_first;
        __syncthreads();  // barriers initialised
    } else {
        share.claim_first(3);
        // start[r] = tiles of rows before r (its barriers also publish the mbarrier init)
        const u32 total = tile_starts<kMaxBalancedRows>(
            T, [&](int row) { return (visible(row) + kTile - 1) / kTile; }, start,
            reinterpret_cast<u32*>(smem + Smem::kScratch));
        if (tid == 0) share.set_total(total);
        __syncthreads();
        take_claim();
    }
    int jbase = 0, seg = 0;  // tiles and segments this CTA scored before
    const int rot = *reinterpret_cast<const int*>(smem + Smem::kRot);  // after the barriers above
    TIMELINE_POINT(1, true);  // the schedule built, the first claim read
    while (seg_num > 0) {  // a segment (a row's part) at a time
        // the next row with tiles, where the claim goes on past this segment
        int next = -1;
        if (balanced && g + seg_num < g_end) {
            next = t;
            do { ++next; } while (start[next + 1] <= g + seg_num);
        }
        score_segment<kDim, kStagedRows>(smem, q16, w_scaled, keys_fp4, key_scale, key_gscale, block_table, t,
                                         visible(t), seg_first, seg_num, jbase, P, E, e_shift, L, scores, ld, hist,
                                         rot, next, next >= 0 ? visible(next) : 0, seg++);
        jbase += seg_num;
        g += seg_num;
        if (!balanced) break;
        if (next < 0) {  // the claim is done: the next one
            __syncthreads();  // every thread has read the claim
            share.claim();
            __syncthreads();
            if (!take_claim()) break;
            continue;
        }
        t = next;
        seg_first = 0;
        seg_num = min(g_end, start[t + 1]) - g;
    }
    TIMELINE_POINT(7, true);  // the CTA's last tile scored
    TIMELINE_TILES(jbase);
    // the select's first kernel may be placed once every CTA is here (it waits for this
    // grid's end before it reads anything: common.cuh), not only once the last has exited:
    // its placement under the last CTAs' ends (decode-128K -0.2%, mtp-2 -0.4% with the same
    // in the pair kernel; docs/performance.md v74)
    wait_for_previous_grid();  // a CTA that scored nothing has not waited (common.cuh: before any exit)
    let_next_grid_start();
    if (balanced && tid == 0) share.done();
}

// ===========================================================================
// Pairs of query rows of one sequence (multi-token decode, prefill): the rows share a
// block table, so each key tile is copied and decoded once and multiplied against both
// queries (one m64n128k16 per k-step: B holds both queries' 64 heads side by side): the
// decode, ~45% of the single-query kernel's instructions, is paid once for two queries.
//
// Work units are row pairs (2u, 2u + 1). A pair shares when row_seq says both rows read the
// same sequence; its tiles run to the longer row's end (each query's scores past its own
// length are written but never counted or read). A pair that does not share (or a last
// row alone) runs as single-row pieces, the second query's half of B stale and its
// epilogues skipped. Up to kMaxRows / 2 pairs, one wave shares all pairs' tiles (as the
// balanced schedule of the single-query kernel).
//
// Each piece stages its two queries itself, from the fp32 query (QueryStaging): no staging
// kernel and no fp16 copy of the run's queries in the workspace.
//
// Shared memory for two queries (2 x 16 KB of B operand, two histograms) keeps 3 CTAs per
// SM with a 3-stage ring and histograms of packed 16-bit counts (flushed to the row's
// 32-bit histogram at least every kFlushTiles tiles, before a count can overflow).
// ===========================================================================
namespace score_wgmma_pairs {
constexpr int kStages = 3;
constexpr int kMaxRows = 8192;   // rows a run: prefill's thousands of short rows in one run
constexpr int kMaxUnits = 1024;  // tile starts the schedule holds (groups of units past that)
static_assert(kMaxRows / 2 % kMaxUnits == 0, "whole groups");
constexpr int kFlushTiles = 256;  // 256 tiles x 128 entries < 65,536
static_assert(kFlushTiles * score_wgmma::kTile < 65536, "a packed 16-bit count cannot overflow between flushes");
constexpr int kPackedWords = score_mma::kHistBins / 2;
// which units a pair kernel instance scores (kUnits) and how a segment runs (kForm)
constexpr int kAllUnits = 0;    // every unit: a pair's pieces shared, a split unit's rows alone in the pair's form
constexpr int kSharedUnits = 1; // only units whose rows share keys (with kLoneRows beside it)
constexpr int kLoneRows = 2;    // only split units, each row alone in the m64n64 form
constexpr int kAnyPiece = 0, kPairPiece = 1, kLonePiece = 2;
}  // namespace score_wgmma_pairs

template <int kDim>
struct WgmmaPairSmem {
    // B of both queries side by side, 128 heads wide: K chunks of 8 slots kPairLbo bytes
    // apart, the first query's 8 core matrices then the second's in each; 16 bytes past a
    // multiple of 128, so that a quarter-warp's staging stores (QueryStaging::store: eight
    // lanes, one head, chunks 2r) fall two to a bank group, not eight
    static constexpr int kPairLbo = 2 * score_wgmma::kLbo + 16;
    static constexpr int kQ1 = score_wgmma::kLbo;                       // second query's first core matrix
    static constexpr int kW = (kDim / 8) * kPairLbo;                    // float[2][64]
    static constexpr int kRing = kW + 2 * 64 * 4;                       // 128-aligned
    static constexpr int kMeta = kRing + score_wgmma_pairs::kStages * BulkRing<kDim, score_wgmma_pairs::kStages>::kStageBytes;
    static constexpr int kBars = kMeta + score_wgmma_pairs::kStages * score_wgmma::kTile * 4;
    static constexpr int kQBar = kBars + score_wgmma_pairs::kStages * 8;  // u64: the query images landed
    static constexpr int kHist = kQBar + 8;  // u32[2][kPackedWords]
    static constexpr int kSched = kHist + 2 * score_wgmma_pairs::kPackedWords * 4;  // int[kMaxUnits + 1]
    static constexpr int kScratch = kSched + (score_wgmma_pairs::kMaxUnits + 1) * 4;  // u32[32]
    static constexpr int kSeqStarts = kScratch + 32 * 4;  // u32[kMaxRows / 32]: rows that start a sequence
    static constexpr int kClaim = kSeqStarts + score_wgmma_pairs::kMaxRows / 8;  // u32[3]: ShareClaims::mine
    static constexpr int kBytes = kClaim + 16;
};

// one more entry in a packed histogram of raw bins (raw_bin_of_plus_zero) where `counted`,
// else an add of 0 to the same word: bin b's count is the 16-bit half (b & 1) of word b / 2.
// From the score's bits u (b = u >> 21): the word u >> 22, the half by bit 21 (a test and a
// select, where shifting 1 by (b & 1) * 16 took three ALU instructions and a move). Every
// float's word lies in the histogram (NaN's and negatives' too), so that the pair kernel's
// epilogue counts without a branch region (docs/performance.md v110)
__device__ __forceinline__ void count_raw_bin_packed(u32* h, float score, bool counted) {
    const u32 u = (u32)__float_as_int(score);
    atomicAdd(&h[u >> 22], counted ? ((u & (1u << 21)) ? 0x10000u : 1u) : 0u);
}

// add a packed histogram of raw bins to the row's 32-bit key-bin one and zero it
__device__ __forceinline__ void flush_packed_histogram(u32* h, u32* row_hist, int tid, int threads) {
    for (int i = tid; i < score_wgmma_pairs::kPackedWords; i += threads) {
        const u32 v = h[i];
        if (v) {
            if (v & 0xffffu) atomicAdd(&row_hist[key_bin_of_raw_bin(2 * i)], v & 0xffffu);
            if (v >> 16) atomicAdd(&row_hist[key_bin_of_raw_bin(2 * i + 1)], v >> 16);
            h[i] = 0u;
        }
    }
}

// Score tiles first_tile .. first_tile + num_tiles - 1 of rows ta and tb (tb < 0: row ta
// alone) with the keys of row ta's block table. The queries: kStagedQueries, staged here from
// the fp32 query (q [T, H, kDim], w [T, H]); else copied from wgmma_prep_kernel's images (q
// taken as qimg [T][PrepToWgmmaImage<kDim>::kBytes], w unused) by bulk copies, a K
// chunk each, on a barrier whose phase `piece` & 1 they complete (piece: the CTA's pieces
// before this one). kForm: score_wgmma_pairs::kAnyPiece (a pair when tb >= 0, else row ta alone
// in the pair's m64n128 form), kPairPiece (tb >= 0) or kLonePiece (tb = -1: row ta's own
// m64n64 MMAs and head sums only; its own kernel instance, kLoneRows).
template <int kDim, bool kStagedQueries, int kForm, class QT>
__device__ __forceinline__ void score_pair_segment(
    unsigned char* smem, const QT* __restrict__ q, const float* __restrict__ w, int H,
    const u8* __restrict__ keys_fp4, const u8* __restrict__ key_scale, const float* __restrict__ key_gscale,
    const int* __restrict__ block_table, int ta, int tb, int na, int nb, int first_tile, int num_tiles, int jbase,
    int P, int E, int e_shift, int L, float* __restrict__ scores, long long ld, u32* __restrict__ hist, int rot,
    bool runs_on,  // runs_on: the claim goes on past this piece (read by timeline points only)
    int piece) {
    using namespace score_wgmma;
    using Smem = WgmmaPairSmem<kDim>;
    constexpr int kS = score_wgmma_pairs::kStages;
    constexpr int kKSteps = kDim / 16;
    constexpr int kThreads = 128;
    constexpr int kHistBins = score_mma::kHistBins;
    constexpr bool kLone = kForm == score_wgmma_pairs::kLonePiece;
    const bool pair = kForm == score_wgmma_pairs::kAnyPiece ? tb >= 0 : kForm == score_wgmma_pairs::kPairPiece;
    unsigned char* qb = smem;  // both queries: [D/8][2][8][8 heads][16 B]
    float* w0 = reinterpret_cast<float*>(smem + Smem::kW);
    float* w1 = w0 + kHeads;
    u32* h0 = reinterpret_cast<u32*>(smem + Smem::kHist);
    u32* h1 = h0 + score_wgmma_pairs::kPackedWords;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    BulkRing<kDim, kS, true> keys;
    keys.ring = smem + Smem::kRing;
    keys.meta_gs = reinterpret_cast<float*>(smem + Smem::kMeta);
    keys.bars = reinterpret_cast<u64*>(smem + Smem::kBars);
    keys.keys_fp4 = keys_fp4; keys.key_scale = key_scale; keys.key_gscale = key_gscale;
    keys.bt = block_table + (long long)ta * L;
    keys.P = P; keys.E = E; keys.e_shift = e_shift; keys.n = pair ? max(na, nb) : na;
    keys.first_tile = first_tile; keys.num_tiles = num_tiles; keys.jbase = jbase;
    keys.row_shift = e_shift < 7 ? e_shift : 7;
    keys.copies = kTile >> keys.row_shift;
    keys.rot = rot;

    // ---- prologue: histograms, the first tiles' copies, both queries staged from fp32
    // (kStagedQueries: no staging kernel, but the second query's loads wait for the first's
    // stores, ~3.8 us of a restart: docs/performance.md v75) or copied from their images
    TIMELINE_POINT(14, jbase > 0);
    QueryStaging<kDim> staging;
    if constexpr (kStagedQueries) {
        staging.load(q, w, H, ta);  // in flight while the histograms clear and the key copies start
    } else if (warp == 0) {  // both images at once: lane l chunk l % 16 of query l / 16, then the weights
        wait_for_previous_grid();  // the images written (a no-op from the CTA's first piece on)
        constexpr u32 kImage = PrepToWgmmaImage<kDim>::kBytes;
        const u32 qbar = smem_u32(smem + Smem::kQBar);
        // the last piece's reads of B and the weights are behind the barriers at its end; each
        // issuing lane orders them before its copy
        fence_proxy_async();
        if (lane == 0) mbar_arrive_expect_tx(qbar, (pair ? 2u : 1u) * kImage);
        __syncwarp();
        const int qi = lane >> 4, kc = lane & 15;
        const unsigned char* img = reinterpret_cast<const unsigned char*>(q) + (long long)(qi ? tb : ta) * kImage;
        if ((qi == 0 || pair) && kc < kDim / 8)
            bulk_copy_g2s(smem_u32(qb + kc * Smem::kPairLbo + qi * Smem::kQ1), img + kc * kLbo, kLbo, qbar);
        if ((qi == 0 || pair) && kc == 0)
            bulk_copy_g2s(smem_u32(qi ? w1 : w0), img + WgmmaSmem<kDim>::kW, kHeads * 4, qbar);
    }
    if (hist)  // no histograms when one CTA per row selects (prefill's short rows)
        for (int i = tid; i < 2 * score_wgmma_pairs::kPackedWords; i += kThreads) h0[i] = 0u;
    keys.start(tid);
    TIMELINE_POINT(12, jbase > 0);  // points 14, 12, 13, 10, 11: a piece after the CTA's first (a restart)
    if constexpr (kStagedQueries) {
        staging.template store<true>(qb, w0, Smem::kPairLbo);
        if (pair) {  // a lone row: the second query's half of B keeps stale values, never read
            staging.load(q, w, H, tb);
            staging.template store<true>(qb + Smem::kQ1, w1, Smem::kPairLbo);
        }
    }
    TIMELINE_POINT(13, jbase > 0);
    if constexpr (kStagedQueries)
        fence_proxy_async();  // the queries, written through the generic proxy, are read by wgmma
    else
        mbar_wait(smem_u32(smem + Smem::kQBar), (u32)piece & 1u);  // the images landed (async proxy, as wgmma)
    __syncthreads();
    TIMELINE_POINT(10, jbase > 0);

    const int g = lane >> 2, c = lane & 3;
    const bool count_keys = hist != nullptr;
    // both queries' descriptor for k-step 0; k-step ks starts 2 * ks * kPairLbo bytes further
    const u64 desc_q = wgmma_desc(qb, Smem::kPairLbo, kCoreBytes);
    float* out0 = scores + (long long)ta * ld;
    float* out1 = pair ? scores + (long long)tb * ld : out0;
    u32 a_frag[2][kKSteps][4];
    // m64n128: acc[0..31] the first query's heads, acc[32..63] the second's; a lone piece's
    // m64n64 only its own (an array of that size: half of the 64 reinterpreted, ptxas
    // serialised the MMAs, C7511)
    float acc[kLone ? 32 : 64];
    auto half = [&](int qi) -> const float (&)[32] { return *reinterpret_cast<const float(*)[32]>(acc + 32 * qi); };

    // the query this lane stores (epilogue): lanes 0, 1 query 0, lanes 2, 3 query 1 (a pair's)
    float* const my_out = c >= 2 ? out1 : out0;
    u32* const my_hist = c >= 2 ? h1 : h0;
    const int my_n = c >= 2 ? nb : na;
    // lanes 2, 3 of a lone row store query 0's sums (the bits lanes 0, 1 store, to the same
    // address) and count nothing: no branch region around the store or the count
    const bool my_second = c >= 2 && pair;
    const int my_count_n = (c < 2 || pair) && count_keys ? my_n : 0;  // entries this lane counts
    // weighted head sums of rows r0, r0 + 8 of a finished sub-tile for both queries (gs: the
    // global scale of my row, r0 + 8 (c & 1)): both sums before any store, so that their two
    // dependent FMA chains interleave (docs/performance.md v67; a lone row's second sum reads
    // stale accumulators and is dropped; a lone piece's is not computed)
    auto epilogue = [&](int s0, float gs) {
        const float mine0 = weighted_head_sum_mine<kFmaReluGroups>(half(0), w0, c);  // row r0 + 8 (c & 1)
        float mine1 = 0.0f;
        if constexpr (!kLone) mine1 = weighted_head_sum_mine<kFmaReluGroups>(half(1), w1, c);
        // lanes c and c ^ 2 hold the same sums: lanes 0 and 1 store query 0's rows r0 and
        // r0 + 8, lanes 2 and 3 query 1's (a lone row's: query 0's again); one store and one
        // count a lane
        const int s = s0 + 8 * (c & 1);
        // an exact -0 folded into +0 (one rounding); a flushed negative product stays -0,
        // counted one bin below +0 (a lower threshold bin at worst: more candidates)
        const float score = fmaf(my_second ? mine1 : mine0, gs, 0.0f);
        my_out[s] = score;
        count_raw_bin_packed(my_hist, score, s < my_count_n && score == score);  // NaN (key 0) not
    };
    auto decode = [&](const unsigned char* st, int u) {
        decode_sub_tile<kDim>(st, u * kSubTile + 16 * warp + g, c, a_frag[u]);
    };
    // one commit group: acc = A(sub-tile u) x B(both queries), one m64n128k16 a k-step; a lone
    // piece's m64n64k16 on its own query, B's first 64 columns, in the same fragment layout
    // (half the tensor work, which a lone row in the pair's form pays whole)
    auto mma = [&](int u) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
            const u64 desc = desc_q + (u64)((2 * ks * Smem::kPairLbo) >> 4);
            if constexpr (kLone)
                wgmma_m64n64k16(acc, a_frag[u][ks], desc, ks > 0);
            else
                wgmma_m64n128k16(acc, a_frag[u][ks], desc, ks > 0);
        }
        wgmma_commit();
    };

    const int r0 = 16 * warp + g;
    // my rows' global scales within a slot, sub-tiles 0 and 1 (one load each a tile, no select)
    const u32 gs_row0 = keys.gscale_offset(r0 + 8 * (c & 1)), gs_row1 = keys.gscale_offset(kSubTile + r0 + 8 * (c & 1));
    // one tile; second = false: a last tile of at most 64 entries either row sees, whose
    // second 64-entry half is neither decoded nor multiplied (its scores never written nor
    // read). Called with constants, so inlined twice, not a branch in the loop: the loop's
    // schedule stays as it is.
    auto tile = [&](int it, bool second) {
        keys.begin_tile(it, tid);
        TIMELINE_POINT(6, jbase == 0 && it == 0);
        TIMELINE_POINT(11, jbase > 0 && it == 0);
        const unsigned char* st = keys.stage(it);
        const int tile_start = (first_tile + it) * kTile;
        const float ga = keys.gscale_at(it, gs_row0), gb = keys.gscale_at(it, gs_row1);
        // one group a sub-tile, both queries in it (m64n128: half the instructions and
        // descriptors of two m64n64 groups); sub-tile 0's MMAs run under sub-tile 1's decode;
        // every group waited for inside the iteration (see the single-query kernel)
        decode(st, 0);
        mma(0);
        if (second) decode(st, 1);
        keys.refill_after_mma(it, tid);
        keys.end_reads();
        wgmma_wait<0>();
        fence_accumulators(acc);
        epilogue(tile_start + r0, ga);
        if (second) {
            mma(1);
            wgmma_wait<0>();
            fence_accumulators(acc);
            epilogue(tile_start + kSubTile + r0, gb);
        }
        if (count_keys && (it + 1) % score_wgmma_pairs::kFlushTiles == 0 && it + 1 < num_tiles) {
            __syncthreads();  // 16-bit counts: flush before any could overflow
            flush_packed_histogram(h0, hist + (long long)ta * kHistBins, tid, kThreads);
            if (pair) flush_packed_histogram(h1, hist + (long long)tb * kHistBins, tid, kThreads);
            __syncthreads();
        }
    };
    const bool half_last = (first_tile + num_tiles - 1) * kTile + kSubTile >= keys.n;
    const int full_tiles = num_tiles - (half_last ? 1 : 0);
    for (int it = 0; it < full_tiles; ++it) tile(it, true);
    if (half_last) tile(full_tiles, false);
    TIMELINE_POINT(8, runs_on);  // points 8-9: the end of a piece the claim runs on past
    __syncthreads();  // histograms complete; every stage read
    if (count_keys) {
        flush_packed_histogram(h0, hist + (long long)ta * kHistBins, tid, kThreads);
        if (pair) flush_packed_histogram(h1, hist + (long long)tb * kHistBins, tid, kThreads);
    }
    __syncthreads();
    TIMELINE_POINT(9, runs_on);
}

// grid (G,), 128 threads: CTA i takes a share of all pairs' tiles (claimed: ShareClaims). Row t is query
// row0 + t of a call whose sequences start at rows cu_seqlens[0 .. n_seq] (varlen layout);
// rows 2u and 2u + 1 share keys when they belong to the same sequence (no sequence starts at
// row 2u + 1). T <= kMaxRows (8,192). kUnits: score_wgmma_pairs::kAllUnits, or one of the two
// halves of a split call (kSharedUnits, kLoneRows: two launches, each over the units the other
// leaves at zero tiles), where many rows are alone (an odd number of rows a sequence): a lone
// row in the pair's form costs about a pair (its m64n128 MMAs are half wasted); in a kernel of
// its own its MMAs are m64n64. (Both forms inlined in one kernel cost the pair's tile loop
// +65 ALU and +44 FMA-pipe instructions and spills: docs/performance.md v103.)
template <int kDim, bool kStagedQueries = false, class QT = float, int kUnits = score_wgmma_pairs::kAllUnits>
__global__ void __launch_bounds__(128, 3)
score_wgmma_pairs_kernel(const QT* __restrict__ q,                // kStagedQueries: [T, H, kDim] (QT: float, half_bits or
                                                                  // bf16_bits), staged here; else the images
                                                                  // [T][PrepToWgmmaImage<kDim>::kBytes] of wgmma_prep_kernel<kDim>
                         const float* __restrict__ w,             // kStagedQueries: [T, H]; else unused
                         int H,                                   // H <= 64
                         const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                         const u8* __restrict__ key_scale,        // [P, E, D/16]
                         const float* __restrict__ key_gscale,    // [P]
                         const int* __restrict__ block_table,     // [T, L]
                         const int* __restrict__ valid_lens,      // [T]
                         const int* __restrict__ cu_seqlens,      // [n_seq + 1]
                         int n_seq, int row0,
                         int T, int P, int E, int e_shift, int L,
                         float* __restrict__ scores,              // [T, ld] workspace
                         long long ld,
                         u32* __restrict__ hist,                  // [T, kHistBins] or nullptr
                         u32* __restrict__ count,                 // [T] candidate counts, cleared here, or nullptr
                         u32* __restrict__ claims)                // [2] ShareClaims' counters, or nullptr: equal shares
{
    TIMELINE_POINT(0, true);  // the CTA's entry (points 0, 1 and 6-14 here: scripts/probe_timeline.py)
    clear_candidate_counts(count, T);
    using namespace score_wgmma;
    using Smem = WgmmaPairSmem<kDim>;
    constexpr int kTiles = kTile;
    static_assert(kDim % 32 == 0 && kDim >= 32 && kDim <= 128, "D must be a multiple of 32 in [32, 128]");
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x;
    const int max_len = L * E;
    auto visible = [&](int row) { return visible_len(valid_lens, row, max_len); };
    // the share claimed first, read after the barriers below (ShareClaims)
    const ShareClaims share{claims, reinterpret_cast<u32*>(smem + Smem::kClaim), {1125u, 1040u, 907u}};
    share.claim_first();
    // Bit t of seq_starts: a sequence starts at row t (0 < t < T), so rows t - 1 and t belong
    // to different sequences (the clamped sequence search that expands the block table
    // changes there, for offsets in order; for any offsets, the kernel reads only in bounds).
    // One pass over the offsets instead of two binary searches a unit (~2 log2(n_seq)
    // dependent loads at every piece start).
    u32* seq_starts = reinterpret_cast<u32*>(smem + Smem::kSeqStarts);
    for (int i = tid; i < score_wgmma_pairs::kMaxRows / 32; i += blockDim.x) seq_starts[i] = 0u;
    __syncthreads();
    for (int s = 1 + tid; s < n_seq; s += blockDim.x) {
        const long long r = (long long)cu_seqlens[s] - row0;
        if (r > 0 && r < T) atomicOr(&seq_starts[r >> 5], 1u << (r & 31));
    }
    __syncthreads();  // the bits, before any unit is evaluated
    auto starts_sequence = [&](int t) { return (seq_starts[t >> 5] >> (t & 31)) & 1u; };
    // a unit's rows, lengths, whether they share keys, and tiles of its first row alone
    struct Unit { int ta, tb, na, nb, tiles_a, tiles; bool shared; };
    auto unit = [&](int u) {
        Unit x;
        x.ta = 2 * u;
        x.tb = 2 * u + 1 < T ? 2 * u + 1 : -1;
        x.na = visible(x.ta);
        x.nb = x.tb >= 0 ? visible(x.tb) : 0;
        x.shared = x.tb >= 0 && !starts_sequence(x.tb);
        x.tiles_a = (x.na + kTiles - 1) / kTiles;
        const int tiles_b = (x.nb + kTiles - 1) / kTiles;
        x.tiles = x.shared ? max(x.tiles_a, tiles_b) : x.tiles_a + tiles_b;
        if ((kUnits == score_wgmma_pairs::kSharedUnits && !x.shared) ||
            (kUnits == score_wgmma_pairs::kLoneRows && x.shared))
            x.tiles = 0;  // the other launch's
        return x;
    };

    u64* bars = reinterpret_cast<u64*>(smem + Smem::kBars);
    if (tid < score_wgmma_pairs::kStages) mbar_init(bars + tid, ring_arrivals(e_shift));
    if (tid == score_wgmma_pairs::kStages) mbar_init(reinterpret_cast<u64*>(smem + Smem::kQBar), 1);  // the images' (an arrival a piece)
    mbar_init_fence();

    const int U = (T + 1) / 2;
    // Units in folded order, k -> unit 0, U - 1, 1, U - 2, ...: a causal run's short and long
    // rows alternate, so every CTA's equal share of the tiles holds as many piece starts
    // (latency: query staging, the first tiles' copies) as the others, and beside them
    // long pieces that keep the tensor cores busy.
    auto unit_at = [&](int k) { return unit((k & 1) ? U - 1 - (k >> 1) : (k >> 1)); };
    // The schedule in shared memory holds the tile starts of groups of 2^gshift units in that
    // order (one a group up to kMaxUnits units, at most kMaxGroup): start[i] = tiles of the
    // units before position i << gshift (its barriers also publish the mbarrier init).
    constexpr int kMaxGroup = score_wgmma_pairs::kMaxRows / 2 / score_wgmma_pairs::kMaxUnits;
    int gshift = 0;
    while (((U - 1) >> gshift) + 1 > score_wgmma_pairs::kMaxUnits) ++gshift;
    const int groups = U > 0 ? ((U - 1) >> gshift) + 1 : 0;
    int* start = reinterpret_cast<int*>(smem + Smem::kSched);
    const u32 total = tile_starts<score_wgmma_pairs::kMaxUnits>(
        groups, [&](int i) {
            int sum = 0;
#pragma unroll
            for (int j = 0; j < kMaxGroup; ++j) {  // unrolled: the units' loads in flight together
                const int k = (i << gshift) + j;
                if (j < (1 << gshift) && k < U) sum += unit_at(k).tiles;
            }
            return sum;
        }, start, reinterpret_cast<u32*>(smem + Smem::kScratch));
    int jbase = 0, piece = 0;  // tiles and pieces this CTA scored before
    // unrotated issuing warps: issue_rotation measured 0.9% slower here (docs/performance.md v69)
    constexpr int rot = 0;
    // the tiles [g, g_end) of all units' tiles in folded order, scored a piece at a time
    auto score_range = [&](int g, int g_end) {
        if (g >= g_end) return;
        // position k (in folded order) of the unit holding tile g, from its group's start
        // (k_start: tiles of the units before it)
        const int grp = item_of_tile(start, groups, g);
        int k = grp << gshift, k_start = start[grp];
        while (true) {
            const Unit x = unit_at(k);
            if (k_start + x.tiles <= g) {  // a unit before tile g (or empty): the next one
                k_start += x.tiles;
                ++k;
                continue;
            }
            const int local = g - k_start, k_end = k_start + x.tiles;
            int ta, tb, na, nb, first, end;  // one piece of the unit: tiles [first, end) of its rows
            if (x.shared) {
                ta = x.ta; tb = x.tb; na = x.na; nb = x.nb; first = local; end = x.tiles;
            } else if (local < x.tiles_a) {
                ta = x.ta; tb = -1; na = x.na; nb = 0; first = local; end = x.tiles_a;
            } else {
                ta = x.tb; tb = -1; na = x.nb; nb = 0; first = local - x.tiles_a; end = x.tiles - x.tiles_a;
            }
            const int num = min(g_end - g, end - first);
            constexpr int kForm = kUnits == score_wgmma_pairs::kSharedUnits ? score_wgmma_pairs::kPairPiece
                                  : kUnits == score_wgmma_pairs::kLoneRows  ? score_wgmma_pairs::kLonePiece
                                                                            : score_wgmma_pairs::kAnyPiece;
            score_pair_segment<kDim, kStagedQueries, kForm>(smem, q, w, H, keys_fp4, key_scale, key_gscale,
                                                            block_table, ta, tb, na, nb, first, num, jbase, P, E,
                                                            e_shift, L, scores, ld, hist, rot, g + num < g_end,
                                                            piece++);
            jbase += num;
            g += num;
            if (g >= g_end) break;
            if (g >= k_end) {  // the unit is done (else its second row's piece comes next)
                k_start = k_end;
                ++k;
            }
        }
    };
    if (tid == 0) share.set_total(total);
    __syncthreads();
    TIMELINE_POINT(1, true);  // the schedule built
    int g, g_end;
    while (share.tiles(g, g_end)) {
        score_range(g, g_end);
        __syncthreads();  // every thread has read the claim
        share.claim();
        __syncthreads();
    }
    TIMELINE_POINT(7, true);  // the CTA's last tile scored
    TIMELINE_TILES(jbase);
    wait_for_previous_grid();  // a CTA that scored nothing has not waited (common.cuh: before any exit)
    let_next_grid_start();     // as the single-query kernel's
    if (tid == 0) share.done();
}
