// score_wgmma.cu: the fast scoring path on Hopper's warpgroup MMA (wgmma, sm_90a).
//
// Same contract and workspace as score_mma.cu, for H <= 64 and D <= 128. One warpgroup (4
// warps) per CTA computes 64 entries x 64 heads per wgmma.m64n64k16:
//   * A = keys, decoded from NVFP4 into registers with the same fragment layout and K
//     permutation as for mma.sync (the wgmma A fragment of each warp is the m16n8k16 one),
//     through the hardware E4M3 conversion; two 64-entry sub-tiles with their own
//     accumulators in flight: the MMAs of one overlap the decode or epilogue of the other;
//   * B = the query, in shared memory in wgmma's K-major core-matrix layout (8 heads x 8
//     K-values per 128-byte core matrix; core matrices 128 bytes apart along the heads,
//     1024 bytes apart along K), in the same permuted K order as the decode;
//   * accumulators (2 x 32 floats a thread) read by the epilogue only after wgmma.wait_group.
// Keys stream through KeyRing (fast_common.cuh); the epilogue is score_mma.cu's.
#include "fast_common.cuh"
#include "bulk_copy.cuh"

namespace score_wgmma {
constexpr int kHeads = 64;          // N of the MMA: heads padded to 64
constexpr int kSubTile = 64;        // M of the MMA: entries per wgmma
constexpr int kCoreBytes = 128;     // 8 rows x 16 bytes
constexpr int kLbo = (kHeads / 8) * kCoreBytes;  // bytes between core matrices along K (1024)
constexpr int kStages = 4;          // shared-memory ring depth (tiles)
constexpr int kTile = 128;          // entries per ring stage: two sub-tiles
constexpr int kMaxBalancedRows = 1024;  // rows the balanced schedule holds in shared memory
// E2M1 goes through the hardware E4M3 conversion (values * 2^-6), so the scales carry 2^-2
// (score_mma.cu's logic-op decode has values * 2^-14 and scales * 2^6: the products are the
// same fp16 numbers; the conversion measured 7% faster here)
constexpr u32 kScaleMul = 0x34003400u;
}  // namespace score_wgmma

__device__ __forceinline__ u64 wgmma_desc(const void* smem_ptr, u32 lbo, u32 sbo) {
    const u32 addr = (u32)__cvta_generic_to_shared(smem_ptr);
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)((lbo >> 4) & 0x3fffu) << 16) | ((u64)((sbo >> 4) & 0x3fffu) << 32);
}

// The wgmma instructions exist on sm_90a only; elsewhere the launcher never picks this
// kernel, and the guards let the file compile for every target.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory"); }
#else
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void wgmma_commit() {}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {}
#endif

// The accumulators are written asynchronously: make every later read depend on this point.
__device__ __forceinline__ void fence_accumulators(float (&d)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A (registers, 64 x 16 fp16) * B (shared memory descriptor, 16 x 64 fp16, K-major)
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const u32 (&a)[4], u64 desc_b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#else
    __trap();  // sm_90a only; the launcher never picks this kernel elsewhere
#endif
}


// Shared-memory bytes of one ring stage (codes, then scales), 128-byte aligned.
__host__ __device__ constexpr int wgmma_stage_bytes(int D) {
    return ((score_wgmma::kTile * (D / 2) + score_wgmma::kTile * (D / 16)) + 127) / 128 * 128;
}

// ---------------------------------------------------------------------------
// The key stream of one CTA through one query row: tiles of 128 entries land in a ring of
// kStages shared-memory stages by bulk copies, one per (tile, pool block) for the codes and
// one for the scales, issued by threads 0 .. kTile / rows_per_copy - 1 (E a power of two:
// a tile covers 128 / E whole blocks, or 128 entries of one block). A copy reports to its
// stage's mbarrier, which every thread arrives at once per tile, so one wait tells a thread
// the whole tile has landed. Block ids and global scales are loaded two and one tiles ahead
// (registers), so no thread waits on its own global loads. Pool blocks that are out of
// range or past the row's visible end are not copied: their stage rows keep stale bytes
// and their global scale reads NaN, so their scores are NaN (never selected) or lie past n
// (never read).
// ---------------------------------------------------------------------------
template <int kDim, int kStagesT = score_wgmma::kStages>
struct BulkRing {
    static constexpr int kCodeBytes = kDim / 2, kScaleBytes = kDim / 16;
    static constexpr int kStageBytes = wgmma_stage_bytes(kDim);
    static constexpr int kScaleOffset = score_wgmma::kTile * kCodeBytes;
    static constexpr int kS = kStagesT;

    unsigned char* ring;  // [kS][kStageBytes]
    float* meta_gs;       // [kS][kTile]: global scale of each copy (index: row >> row_shift)
    u64* bars;            // [kS]
    const u8* __restrict__ keys_fp4;
    const u8* __restrict__ key_scale;
    const float* __restrict__ key_gscale;
    const int* __restrict__ bt;  // this row's block table
    int P, E, e_shift, n, first_tile, num_tiles, jbase;
    int row_shift;        // log2(rows per copy) = log2(min(E, 128))
    int copies;           // copies per tile = 128 >> row_shift
    int b_next2, b_next;  // prefetched block ids (tiles it + kS, it + kS - 1 ... see advance)
    float g_next;

    // Is this thread an issuer (thread i < copies: the i-th block run of every tile)?
    __device__ bool issuer(int tid) const { return tid < copies; }

    // block id of my run of tile j of this segment, -1 when not visible or out of range
    __device__ int block_of(int j, int tid) const {
        const int s = (first_tile + j) * score_wgmma::kTile + (tid << row_shift);
        if (j >= num_tiles || s >= n) return -1;
        const int b = bt[s >> e_shift];
        return (b >= 0 && b < P) ? b : -1;
    }
    __device__ float scale_of(int b) const { return b >= 0 ? key_gscale[b] : __int_as_float(0x7fc00000); }

    // Issue tile j (segment-relative) into its stage: every thread arrives once.
    __device__ void issue(int j, int tid, int b, float g) {
        const int slot = (u32)(jbase + j) % kS;
        u64* bar = bars + slot;
        if (!issuer(tid)) {
            mbar_arrive(bar);
            return;
        }
        meta_gs[slot * score_wgmma::kTile + tid] = g;
        if (b < 0) {
            mbar_arrive(bar);
            return;
        }
        const int rows = 1 << row_shift;
        const int s = (first_tile + j) * score_wgmma::kTile + (tid << row_shift);
        const long long ent = (long long)b * E + (s & (E - 1));
        unsigned char* st = ring + slot * kStageBytes;
        const u32 code_bytes = rows * kCodeBytes, scale_bytes = rows * kScaleBytes;
        mbar_arrive_expect_tx(bar, code_bytes + scale_bytes);
        bulk_copy_g2s(st + tid * code_bytes, keys_fp4 + ent * kCodeBytes, code_bytes, bar);
        bulk_copy_g2s(st + kScaleOffset + tid * scale_bytes, key_scale + ent * kScaleBytes, scale_bytes, bar);
    }

    // Before the loop (after the caller's barrier that retired the previous segment):
    // tiles 0 .. kS - 2 issued, block ids of the next two tiles in flight.
    __device__ void start(int tid) {
        for (int j = 0; j < kS - 1; ++j) {
            const int b = j < num_tiles && issuer(tid) ? block_of(j, tid) : -1;
            if (j < num_tiles) issue(j, tid, b, scale_of(b));
        }
        b_next = issuer(tid) ? block_of(kS - 1, tid) : -1;
        b_next2 = issuer(tid) ? block_of(kS, tid) : -1;
        g_next = scale_of(b_next);
    }

    // Top of iteration it: wait for tile it, barrier (every thread is done with tile it - 1,
    // whose stage is refilled now), issue tile it + kS - 1, advance the prefetch.
    __device__ void begin_tile(int it, int tid) {
        const int j = jbase + it;
        mbar_wait(bars + (u32)j % kS, ((u32)j / kS) & 1u);
        __syncthreads();
        if (it + kS - 1 < num_tiles) issue(it + kS - 1, tid, b_next, g_next);
        b_next = b_next2;
        g_next = scale_of(b_next);
        b_next2 = issuer(tid) ? block_of(it + kS + 1, tid) : -1;
    }
    __device__ const unsigned char* stage(int it) const { return ring + (u32)(jbase + it) % kS * kStageBytes; }
    __device__ float gscale(int it, int row) const {
        return meta_gs[(u32)(jbase + it) % kS * score_wgmma::kTile + (row >> row_shift)];
    }
};

// My (fragment column c) code words of stage row `row` and the fp16x2 scale splats
// (the stage layout of BulkRing: codes [128][D/2], then scales [128][D/16]).
template <int kDim>
__device__ __forceinline__ void read_stage_row(const unsigned char* st, int row, int c, u32 (&raw)[kDim / 32],
                                               u32 (&sc)[kDim / 32]) {
    static_assert(KeyRing<kDim>::kCodeBytes == BulkRing<kDim>::kCodeBytes &&
                  KeyRing<kDim>::kScaleOffset == BulkRing<kDim>::kScaleOffset, "same stage layout as KeyRing");
    read_row<kDim, score_wgmma::kScaleMul>(st, row, c, raw, sc);
}

// The A fragments (kDim/16 k-steps) of one 64-entry sub-tile starting at stage row `base`:
// my rows r0 = base + 16*warp + g and r0 + 8, decoded from E2M1 x E4M3 to fp16.
template <int kDim>
__device__ __forceinline__ void decode_sub_tile(const unsigned char* st, int r0, int c, u32 (&a)[kDim / 16][4]) {
    constexpr int kWords = kDim / 32;
    u32 raw0[kWords], sc0[kWords], raw1[kWords], sc1[kWords];
    read_stage_row<kDim>(st, r0, c, raw0, sc0);
    read_stage_row<kDim>(st, r0 + 8, c, raw1, sc1);
#pragma unroll
    for (int wd = 0; wd < kWords; ++wd) {
        u32 d0[4], d1[4];
        e2m1x8_to_f16x2_cvt(raw0[wd], d0);
        e2m1x8_to_f16x2_cvt(raw1[wd], d1);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            d0[i] = hmul2(d0[i], sc0[wd]);
            d1[i] = hmul2(d1[i], sc1[wd]);
        }
        // k-step 2wd: (lo nibbles, hi nibbles) of bytes 0-1; k-step 2wd+1: bytes 2-3
        a[2 * wd][0] = d0[0]; a[2 * wd][1] = d1[0];
        a[2 * wd][2] = d0[1]; a[2 * wd][3] = d1[1];
        a[2 * wd + 1][0] = d0[2]; a[2 * wd + 1][1] = d1[2];
        a[2 * wd + 1][2] = d0[3]; a[2 * wd + 1][3] = d1[3];
    }
}

// One commit group: acc = A (a sub-tile's fragments) x B (the query at descriptor desc),
// over the kDim/16 k-steps.
template <int kDim>
__device__ __forceinline__ void mma_sub_tile(float (&acc)[32], const u32 (&a)[kDim / 16][4], u64 desc) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks)
        wgmma_m64n64k16(acc, a[ks], desc + (u64)((2 * ks * score_wgmma::kLbo) >> 4), ks > 0);
    wgmma_commit();
}

// Weighted head sums of my two rows of a finished m64n64 sub-tile (accumulators d; rows r0
// and r0 + 8, heads 8j + 2c, +1 in this lane, the quad's four lanes summed): .x row r0, .y
// row r0 + 8, in every lane of the quad. w: the 64 weights in shared memory.
__device__ __forceinline__ float2 weighted_head_sums(const float (&d)[32], const float* w, int c) {
    // two partial sums per row (even and odd heads) halve the dependent FMA chain
    float lo0 = 0.0f, lo1 = 0.0f, hi0 = 0.0f, hi1 = 0.0f;
#pragma unroll
    for (int j = 0; j < score_wgmma::kHeads / 8; ++j) {
        const float2 wv = *reinterpret_cast<const float2*>(w + 8 * j + 2 * c);  // heads 8j+2c, +1
        lo0 = fmaf(wv.x, relu_nan(d[4 * j]), lo0);
        lo1 = fmaf(wv.y, relu_nan(d[4 * j + 1]), lo1);
        hi0 = fmaf(wv.x, relu_nan(d[4 * j + 2]), hi0);
        hi1 = fmaf(wv.y, relu_nan(d[4 * j + 3]), hi1);
    }
    float lo = lo0 + lo1, hi = hi0 + hi1;
    lo += __shfl_xor_sync(FULL_MASK, lo, 1);
    hi += __shfl_xor_sync(FULL_MASK, hi, 1);
    lo += __shfl_xor_sync(FULL_MASK, lo, 2);
    hi += __shfl_xor_sync(FULL_MASK, hi, 2);
    return make_float2(lo, hi);
}

template <int kDim>
struct WgmmaSmem {
    static constexpr int kQBytes = (kDim / 8) * score_wgmma::kLbo;  // B in core-matrix layout
    static constexpr int kW = kQBytes;                               // float[64]
    static constexpr int kRing = kW + 64 * 4;                        // BulkRing stages (128-aligned)
    static constexpr int kMeta = kRing + score_wgmma::kStages * BulkRing<kDim>::kStageBytes;
    static constexpr int kBars = kMeta + score_wgmma::kStages * score_wgmma::kTile * 4;
    static constexpr int kHist = kBars + score_wgmma::kStages * 8;
    static constexpr int kSched = kHist + score_mma::kHistBins * 4;  // int[kMaxBalancedRows + 1]
    static constexpr int kScratch = kSched + (score_wgmma::kMaxBalancedRows + 1) * 4;  // u32[32]
    static constexpr int kBytes = kScratch + 32 * 4;
};

// Score one segment of one row: tiles first_tile .. first_tile + num_tiles - 1 of row t
// (num_tiles > 0). Ring slots continue from jbase (the tiles this CTA scored before).
template <int kDim>
__device__ __forceinline__ void score_segment(
    unsigned char* smem, const unsigned short* __restrict__ q16, const float* __restrict__ w_scaled,
    const u8* __restrict__ keys_fp4, const u8* __restrict__ key_scale, const float* __restrict__ key_gscale,
    const int* __restrict__ block_table, int t, int n, int first_tile, int num_tiles, int jbase, int P, int E,
    int e_shift, int L, float* __restrict__ scores, long long ld, u32* __restrict__ hist) {
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

    // ---- prologue: the query into the core-matrix layout, weights, histogram, first tiles
    {
        const unsigned short* qsrc = q16 + (long long)t * kHeads * kRowHalves;
        for (int i = tid; i < kHeads * (kDim / 8); i += kThreads) {
            const int h = i / (kDim / 8), kc = i % (kDim / 8);
            cp_async_16(qb + kc * kLbo + (h / 8) * kCoreBytes + (h % 8) * 16, qsrc + h * kRowHalves + kc * 8, true);
        }
        cp_async_commit();
        for (int h = tid; h < kHeads; h += kThreads) wsm[h] = w_scaled[(long long)t * kHeads + h];
    }
    for (int i = tid; i < kHistBins; i += kThreads) hist_s[i] = 0u;
    keys.start(tid);
    cp_async_wait<0>();
    fence_proxy_async();  // the query, written through the generic proxy, is read by wgmma
    __syncthreads();

    const int g = lane >> 2, c = lane & 3;
    float* out = scores + (long long)t * ld;
    const bool count_keys = hist != nullptr;  // no histogram when one CTA per row selects
    // the query's descriptor for k-step 0; k-step ks starts 2 * ks * kLbo bytes further (the
    // address field, bytes / 16, cannot carry: shared memory is below 256 KB)
    const u64 desc_q = wgmma_desc(qb, kLbo, kCoreBytes);
    // Sub-tile u of a tile accumulates into acc[u] from a_frag[u]: both sub-tiles' MMAs are
    // in flight at once, so sub-tile 0's MMAs overlap sub-tile 1's decode and sub-tile 1's
    // MMAs overlap sub-tile 0's epilogue.
    u32 a_frag[2][kKSteps][4];
    float acc[2][32];
    // weighted head sum of rows r0 and r0 + 8 of a finished sub-tile (entries s0, s0 + 8)
    auto epilogue = [&](const float (&d)[32], int s0, float g0, float g1) {
        const float2 sums = weighted_head_sums(d, wsm, c);
        const float lo = sums.x, hi = sums.y;
        // lane c = 0 stores row r0, lane c = 1 row r0 + 8 (one predicated path, no branches)
        if (c < 2) {
            const int s = s0 + 8 * c;
            const float score = (c ? hi : lo) * (c ? g1 : g0) + 0.0f;  // -0 folded into +0
            out[s] = score;
            const u32 key = score_to_key(score);
            if (count_keys && s < n && key) atomicAdd(&hist_s[key >> 21], 1u);
        }
    };

    for (int it = 0; it < num_tiles; ++it) {
        keys.begin_tile(it, tid);
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
        const int r0 = 16 * warp + g;
        wgmma_wait<1>();
        fence_accumulators(acc[0]);
        epilogue(acc[0], tile_start + r0, keys.gscale(it, r0), keys.gscale(it, r0 + 8));
        wgmma_wait<0>();
        fence_accumulators(acc[1]);
        epilogue(acc[1], tile_start + kSubTile + r0, keys.gscale(it, kSubTile + r0),
                 keys.gscale(it, kSubTile + r0 + 8));
    }
    __syncthreads();  // histogram complete; every stage read (the next segment refills them)
    if (count_keys) flush_histogram(hist_s, hist + (long long)t * kHistBins, tid, kThreads);
    __syncthreads();
}

// The balanced schedule's tile starts, by one CTA of 128 threads: start[i] = the tiles of
// items 0 .. i-1 (rows, or row pairs), start[n] = the total, which is returned; tiles(i) is
// item i's tile count, n <= kMax. Its barriers also publish what the CTA wrote before.
template <int kMax, typename TilesOf>
__device__ __forceinline__ u32 tile_starts(int n, TilesOf tiles, int* start, u32* scratch) {
    constexpr int kPer = kMax / 128;
    const int tid = threadIdx.x;
    u32 mine[kPer], sum = 0u;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int i = tid * kPer + j;
        mine[j] = i < n ? (u32)tiles(i) : 0u;
        sum += mine[j];
    }
    u32 total;
    u32 base = block_exclusive_scan<128>(sum, scratch, &total);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int i = tid * kPer + j;
        if (i < n) start[i] = (int)base;
        base += mine[j];
    }
    if (tid == 0) start[n] = (int)total;
    __syncthreads();
    return total;
}

// The item holding tile g: the last i < n with start[i] <= g (empty items share starts).
__device__ __forceinline__ int item_of_tile(const int* start, int n, int g) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (start[mid] <= g) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Two schedules, one kernel:
//   * balanced (grid (G,)): the tiles of all rows, concatenated, are cut into G nearly equal
//     ranges, one per CTA; a range may span several rows (a segment per row). Ragged batches
//     and single long rows keep every SM busy. Needs T <= kMaxBalancedRows.
//   * per row (grid (T, chunks)): CTA (t, y) scores tiles y * tiles_per_cta .. of row t.
// E must be a power of two with E * D/16 a multiple of 16 (bulk copies of whole block runs);
// key_scale 16-byte aligned. The launcher checks both.
template <int kDim>
__global__ void __launch_bounds__(128, 3)
score_wgmma_kernel(const unsigned short* __restrict__ q16,  // [T, 64, kDim + 8] from prep_query_kernel<kDim, 8>
                   const float* __restrict__ w_scaled,      // [T, 64]
                   const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                   const u8* __restrict__ key_scale,        // [P, E, D/16]
                   const float* __restrict__ key_gscale,    // [P]
                   const int* __restrict__ block_table,     // [T, L]
                   const int* __restrict__ valid_lens,      // [T]
                   int T, int P, int E, int e_shift, int L, int tiles_per_cta, int balanced,
                   float* __restrict__ scores,              // [T, ld] workspace
                   long long ld,
                   u32* __restrict__ hist)                  // [T, kHistBins] or nullptr
{
    using namespace score_wgmma;
    using Smem = WgmmaSmem<kDim>;
    static_assert(kDim % 32 == 0 && kDim >= 32 && kDim <= 128, "D must be a multiple of 32 in [32, 128]");
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x;
    const int max_len = L * E;
    auto visible = [&](int row) { return visible_len(valid_lens, row, max_len); };

    u64* bars = reinterpret_cast<u64*>(smem + Smem::kBars);
    if (tid < kStages) mbar_init(bars + tid, 128);
    mbar_init_fence();

    int* start = reinterpret_cast<int*>(smem + Smem::kSched);
    int t = blockIdx.x, seg_first = 0, seg_num = 0, g = 0, g_end = 0;
    if (!balanced) {
        seg_first = blockIdx.y * tiles_per_cta;
        seg_num = min(seg_first + tiles_per_cta, (visible(t) + kTile - 1) / kTile) - seg_first;
        __syncthreads();  // barriers initialised
    } else {
        // start[r] = tiles of rows before r (its barriers also publish the mbarrier init)
        const u32 total = tile_starts<kMaxBalancedRows>(
            T, [&](int row) { return (visible(row) + kTile - 1) / kTile; }, start,
            reinterpret_cast<u32*>(smem + Smem::kScratch));
        const long long G = gridDim.x;
        g = (int)((long long)total * blockIdx.x / G);
        g_end = (int)((long long)total * (blockIdx.x + 1) / G);
        if (g < g_end) {
            t = item_of_tile(start, T, g);
            seg_first = g - start[t];
            seg_num = min(g_end, start[t + 1]) - g;
        }
    }
    int jbase = 0;
    while (seg_num > 0) {
        score_segment<kDim>(smem, q16, w_scaled, keys_fp4, key_scale, key_gscale, block_table, t, visible(t),
                            seg_first, seg_num, jbase, P, E, e_shift, L, scores, ld, hist);
        jbase += seg_num;
        g += seg_num;
        if (!balanced || g >= g_end) break;
        do { ++t; } while (start[t + 1] <= g);  // the next row with tiles
        seg_first = 0;
        seg_num = min(g_end, start[t + 1]) - g;
    }
}

// ===========================================================================
// Pairs of query rows of one sequence (multi-token decode, prefill): the rows share a
// block table, so each key tile is copied and decoded once and multiplied against both
// queries (two wgmma groups per decoded A fragment): the decode, ~45% of the single-query
// kernel's instructions, is paid once for two queries.
//
// Work units are row pairs (2u, 2u + 1). A pair shares when row_seq says both rows read the
// same sequence; its tiles run to the longer row's end (each query's scores past its own
// length are written but never counted or read). A pair that does not share (or a last
// row alone) runs as single-row pieces, the second query slot shadowing the first with its
// stores off. Up to kMaxUnits pairs, one wave shares all pairs' tiles (as the balanced
// schedule of the single-query kernel).
//
// Shared memory for two queries (2 x 16 KB of B operand, two histograms) keeps 3 CTAs per
// SM with a 3-stage ring and histograms of packed 16-bit counts (flushed to the row's
// 32-bit histogram at least every kFlushTiles tiles, before a count can overflow).
// ===========================================================================
namespace score_wgmma_pairs {
constexpr int kStages = 3;
constexpr int kMaxUnits = score_wgmma::kMaxBalancedRows / 2;
constexpr int kFlushTiles = 256;  // 256 tiles x 128 entries < 65,536
constexpr int kPackedWords = score_mma::kHistBins / 2;
}  // namespace score_wgmma_pairs

template <int kDim>
struct WgmmaPairSmem {
    static constexpr int kQBytes = (kDim / 8) * score_wgmma::kLbo;
    static constexpr int kQ1 = kQBytes;                                 // second query's B
    static constexpr int kW = 2 * kQBytes;                              // float[2][64]
    static constexpr int kRing = kW + 2 * 64 * 4;                       // 128-aligned
    static constexpr int kMeta = kRing + score_wgmma_pairs::kStages * BulkRing<kDim, score_wgmma_pairs::kStages>::kStageBytes;
    static constexpr int kBars = kMeta + score_wgmma_pairs::kStages * score_wgmma::kTile * 4;
    static constexpr int kHist = kBars + score_wgmma_pairs::kStages * 8;  // u32[2][kPackedWords]
    static constexpr int kSched = kHist + 2 * score_wgmma_pairs::kPackedWords * 4;  // int[kMaxUnits + 1]
    static constexpr int kScratch = kSched + (score_wgmma_pairs::kMaxUnits + 1) * 4;  // u32[32]
    static constexpr int kBytes = kScratch + 32 * 4;
};

// one more entry in a packed histogram: bin b's count is the 16-bit half (b & 1) of word b / 2
__device__ __forceinline__ void count_key_packed(u32* h, u32 key) {
    const u32 bin = key >> 21;
    atomicAdd(&h[bin >> 1], 1u << ((bin & 1u) << 4));
}

// add a packed histogram to the row's 32-bit one and zero it
__device__ __forceinline__ void flush_packed_histogram(u32* h, u32* row_hist, int tid, int threads) {
    for (int i = tid; i < score_wgmma_pairs::kPackedWords; i += threads) {
        const u32 v = h[i];
        if (v) {
            if (v & 0xffffu) atomicAdd(&row_hist[2 * i], v & 0xffffu);
            if (v >> 16) atomicAdd(&row_hist[2 * i + 1], v >> 16);
            h[i] = 0u;
        }
    }
}

// Score tiles first_tile .. first_tile + num_tiles - 1 of rows ta and tb (tb < 0: row ta
// alone) with the keys of row ta's block table.
template <int kDim>
__device__ __forceinline__ void score_pair_segment(
    unsigned char* smem, const unsigned short* __restrict__ q16, const float* __restrict__ w_scaled,
    const u8* __restrict__ keys_fp4, const u8* __restrict__ key_scale, const float* __restrict__ key_gscale,
    const int* __restrict__ block_table, int ta, int tb, int na, int nb, int first_tile, int num_tiles, int jbase,
    int P, int E, int e_shift, int L, float* __restrict__ scores, long long ld, u32* __restrict__ hist) {
    using namespace score_wgmma;
    using Smem = WgmmaPairSmem<kDim>;
    constexpr int kS = score_wgmma_pairs::kStages;
    constexpr int kKSteps = kDim / 16;
    constexpr int kRowHalves = kDim + 8;
    constexpr int kThreads = 128;
    constexpr int kHistBins = score_mma::kHistBins;
    const bool pair = tb >= 0;
    unsigned char* qb0 = smem;
    unsigned char* qb1 = smem + Smem::kQ1;
    float* w0 = reinterpret_cast<float*>(smem + Smem::kW);
    float* w1 = w0 + kHeads;
    u32* h0 = reinterpret_cast<u32*>(smem + Smem::kHist);
    u32* h1 = h0 + score_wgmma_pairs::kPackedWords;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    BulkRing<kDim, kS> keys;
    keys.ring = smem + Smem::kRing;
    keys.meta_gs = reinterpret_cast<float*>(smem + Smem::kMeta);
    keys.bars = reinterpret_cast<u64*>(smem + Smem::kBars);
    keys.keys_fp4 = keys_fp4; keys.key_scale = key_scale; keys.key_gscale = key_gscale;
    keys.bt = block_table + (long long)ta * L;
    keys.P = P; keys.E = E; keys.e_shift = e_shift; keys.n = pair ? max(na, nb) : na;
    keys.first_tile = first_tile; keys.num_tiles = num_tiles; keys.jbase = jbase;
    keys.row_shift = e_shift < 7 ? e_shift : 7;
    keys.copies = kTile >> keys.row_shift;

    // ---- prologue: both queries into the core-matrix layout, weights, histograms, tiles
    for (int qi = 0; qi < (pair ? 2 : 1); ++qi) {
        const int t = qi ? tb : ta;
        unsigned char* qb = qi ? qb1 : qb0;
        const unsigned short* qsrc = q16 + (long long)t * kHeads * kRowHalves;
        for (int i = tid; i < kHeads * (kDim / 8); i += kThreads) {
            const int h = i / (kDim / 8), kc = i % (kDim / 8);
            cp_async_16(qb + kc * kLbo + (h / 8) * kCoreBytes + (h % 8) * 16, qsrc + h * kRowHalves + kc * 8, true);
        }
        for (int h = tid; h < kHeads; h += kThreads) (qi ? w1 : w0)[h] = w_scaled[(long long)t * kHeads + h];
    }
    cp_async_commit();
    for (int i = tid; i < 2 * score_wgmma_pairs::kPackedWords; i += kThreads) h0[i] = 0u;
    keys.start(tid);
    cp_async_wait<0>();
    fence_proxy_async();  // the queries, written through the generic proxy, are read by wgmma
    __syncthreads();

    const int g = lane >> 2, c = lane & 3;
    const bool count_keys = hist != nullptr;
    const u64 desc0 = wgmma_desc(qb0, kLbo, kCoreBytes);
    const u64 desc1 = pair ? wgmma_desc(qb1, kLbo, kCoreBytes) : desc0;  // a lone row: slot 1 shadows slot 0
    float* out0 = scores + (long long)ta * ld;
    float* out1 = pair ? scores + (long long)tb * ld : out0;
    u32 a_frag[2][kKSteps][4];
    float acc[2][32];

    // weighted head sum of rows r0, r0 + 8 of a finished sub-tile for query slot qi
    auto epilogue = [&](const float (&d)[32], int qi, int s0, float g0, float g1) {
        const float2 sums = weighted_head_sums(d, qi ? w1 : w0, c);
        const float lo = sums.x, hi = sums.y;
        const bool live = qi == 0 || pair;
        if (live && c < 2) {
            const int s = s0 + 8 * c;
            const float score = (c ? hi : lo) * (c ? g1 : g0) + 0.0f;  // -0 folded into +0
            (qi ? out1 : out0)[s] = score;
            const u32 key = score_to_key(score);
            if (count_keys && s < (qi ? nb : na) && key) count_key_packed(qi ? h1 : h0, key);
        }
    };
    auto decode = [&](const unsigned char* st, int u) {
        decode_sub_tile<kDim>(st, u * kSubTile + 16 * warp + g, c, a_frag[u]);
    };
    // one commit group: acc[v] = A(sub-tile u) x B(query of descriptor desc)
    auto mma = [&](int v, int u, u64 desc) { mma_sub_tile<kDim>(acc[v], a_frag[u], desc); };

    const int r0 = 16 * warp + g;
    for (int it = 0; it < num_tiles; ++it) {
        keys.begin_tile(it, tid);
        const unsigned char* st = keys.stage(it);
        const int tile_start = (first_tile + it) * kTile;
        const float ga0 = keys.gscale(it, r0), ga1 = keys.gscale(it, r0 + 8);
        const float gb0 = keys.gscale(it, kSubTile + r0), gb1 = keys.gscale(it, kSubTile + r0 + 8);
        // groups: (sub-tile 0, q0) (0, q1) (1, q0) (1, q1), accumulators alternating; every
        // group waited for inside the iteration (see the single-query kernel)
        decode(st, 0);
        mma(0, 0, desc0);
        mma(1, 0, desc1);
        decode(st, 1);
        wgmma_wait<1>();
        fence_accumulators(acc[0]);
        epilogue(acc[0], 0, tile_start + r0, ga0, ga1);
        mma(0, 1, desc0);
        wgmma_wait<1>();
        fence_accumulators(acc[1]);
        epilogue(acc[1], 1, tile_start + r0, ga0, ga1);
        mma(1, 1, desc1);
        wgmma_wait<1>();
        fence_accumulators(acc[0]);
        epilogue(acc[0], 0, tile_start + kSubTile + r0, gb0, gb1);
        wgmma_wait<0>();
        fence_accumulators(acc[1]);
        epilogue(acc[1], 1, tile_start + kSubTile + r0, gb0, gb1);
        if (count_keys && (it + 1) % score_wgmma_pairs::kFlushTiles == 0 && it + 1 < num_tiles) {
            __syncthreads();  // 16-bit counts: flush before any could overflow
            flush_packed_histogram(h0, hist + (long long)ta * kHistBins, tid, kThreads);
            if (pair) flush_packed_histogram(h1, hist + (long long)tb * kHistBins, tid, kThreads);
            __syncthreads();
        }
    }
    __syncthreads();  // histograms complete; every stage read
    if (count_keys) {
        flush_packed_histogram(h0, hist + (long long)ta * kHistBins, tid, kThreads);
        if (pair) flush_packed_histogram(h1, hist + (long long)tb * kHistBins, tid, kThreads);
    }
    __syncthreads();
}

// grid (G,), 128 threads: CTA i takes an equal share of all pairs' tiles. Row t is query
// row0 + t of a call whose sequences start at rows cu_seqlens[0 .. n_seq] (varlen layout);
// rows 2u and 2u + 1 share keys when they belong to the same sequence (found by the same
// clamped binary search that expands the block table). T <= kMaxBalancedRows.
template <int kDim>
__global__ void __launch_bounds__(128, 3)
score_wgmma_pairs_kernel(const unsigned short* __restrict__ q16,  // [T, 64, kDim + 8]
                         const float* __restrict__ w_scaled,      // [T, 64]
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
                         u32* __restrict__ hist)                  // [T, kHistBins] or nullptr
{
    using namespace score_wgmma;
    using Smem = WgmmaPairSmem<kDim>;
    constexpr int kTiles = kTile;
    static_assert(kDim % 32 == 0 && kDim >= 32 && kDim <= 128, "D must be a multiple of 32 in [32, 128]");
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x;
    const int max_len = L * E;
    auto visible = [&](int row) { return visible_len(valid_lens, row, max_len); };
    auto seq_of = [&](int t) {
        const long long x = (long long)t + row0;
        int lo = 0, hi = n_seq + 1;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if ((long long)cu_seqlens[mid] <= x) lo = mid + 1; else hi = mid;
        }
        return min(max(lo - 1, 0), max(n_seq - 1, 0));
    };
    // a unit's rows, lengths, whether they share keys, and tiles of its first row alone
    struct Unit { int ta, tb, na, nb, tiles_a, tiles; bool shared; };
    auto unit = [&](int u) {
        Unit x;
        x.ta = 2 * u;
        x.tb = 2 * u + 1 < T ? 2 * u + 1 : -1;
        x.na = visible(x.ta);
        x.nb = x.tb >= 0 ? visible(x.tb) : 0;
        x.shared = x.tb >= 0 && seq_of(x.ta) == seq_of(x.tb);
        x.tiles_a = (x.na + kTiles - 1) / kTiles;
        const int tiles_b = (x.nb + kTiles - 1) / kTiles;
        x.tiles = x.shared ? max(x.tiles_a, tiles_b) : x.tiles_a + tiles_b;
        return x;
    };

    u64* bars = reinterpret_cast<u64*>(smem + Smem::kBars);
    if (tid < score_wgmma_pairs::kStages) mbar_init(bars + tid, 128);
    mbar_init_fence();

    const int U = (T + 1) / 2;
    int* start = reinterpret_cast<int*>(smem + Smem::kSched);
    // start[u] = tiles of units before u (its barriers also publish the mbarrier init)
    const u32 total = tile_starts<score_wgmma_pairs::kMaxUnits>(
        U, [&](int i) { return unit(i).tiles; }, start, reinterpret_cast<u32*>(smem + Smem::kScratch));
    const long long G = gridDim.x;
    int g = (int)((long long)total * blockIdx.x / G);
    const int g_end = (int)((long long)total * (blockIdx.x + 1) / G);
    if (g >= g_end) return;
    int u = item_of_tile(start, U, g), jbase = 0;
    while (true) {
        const Unit x = unit(u);
        const int local = g - start[u];
        int ta, tb, na, nb, first, end;  // one piece of the unit: tiles [first, end) of its rows
        if (x.shared) {
            ta = x.ta; tb = x.tb; na = x.na; nb = x.nb; first = local; end = x.tiles;
        } else if (local < x.tiles_a) {
            ta = x.ta; tb = -1; na = x.na; nb = 0; first = local; end = x.tiles_a;
        } else {
            ta = x.tb; tb = -1; na = x.nb; nb = 0; first = local - x.tiles_a; end = x.tiles - x.tiles_a;
        }
        const int num = min(g_end - g, end - first);
        score_pair_segment<kDim>(smem, q16, w_scaled, keys_fp4, key_scale, key_gscale, block_table, ta, tb, na, nb,
                                 first, num, jbase, P, E, e_shift, L, scores, ld, hist);
        jbase += num;
        g += num;
        if (g >= g_end) break;
        while (start[u + 1] <= g) ++u;  // the unit holding tile g (skipping empty ones)
    }
}
