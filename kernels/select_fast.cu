// select_fast.cu: exact top-k over many CTAs per row, for long rows and large batches.
//
//   1. histogram: count the top 11 bits of every score key of a row (2048 bins); the
//      tensor-core scoring kernel does this in its epilogue, topk_histogram_kernel does it
//      for the FP32 path; or, for runs scored without one (the keys-stationary kernel),
//      topk_sample_kernel sets each row's candidate threshold key from a sample of its
//      scores instead (one read of 32 KB a row where a histogram reads the whole row);
//   2. topk_filter_kernel: every CTA finds the bin b* holding its row's k-th best key
//      (threshold_bin), then every entry whose key is in a bin >= b* becomes a candidate,
//      appended to a bounded per-row buffer of kCap (key, index) pairs; the counter keeps
//      counting past kCap, so an overflow is never silent;
//   3. the candidates ordered by (score descending, index ascending) give the answer. Every
//      entry tying with the k-th best is a candidate, so the tie rule holds exactly.
//      topk_rank_kernel (runs of few rows): each candidate's output slot is its rank among
//      the row's candidates, counted within its fine key bin by one of several CTAs per
//      row (a row with more than kRankMax candidates: the single-CTA radix select over its
//      scores); topk_final_kernel (runs of many rows): one CTA per row, a bitonic sort of
//      the candidates (first cut to those at or above the k-th key where there are more
//      than the winners' sort holds), or, where they overflowed the buffer, the single-CTA
//      radix select over the full score row.
//   Runs of about an SM's worth of rows or more take steps 2 and 3 in one CTA a row instead
//   (topk_row_stream_kernel): the row streamed through shared memory, its candidates
//   gathered and ranked there, no candidate buffer in global memory.
// Candidate order in the buffer depends on atomics; ranks and the sort make the output
// deterministic.
#include "common.cuh"
#include "select_row.cuh"

namespace select_fast {
constexpr int kBins = 2048;       // top 11 bits of a key
constexpr int kBinShift = 21;
constexpr int kRankMax = 4096;    // rows with more candidates are selected from their scores
constexpr int kRankBins = 1024;   // fine key bins of a row's candidates in topk_rank_kernel
constexpr int kSampleChunks = 512;                    // topk_sample_kernel: 16-entry chunks a row
constexpr int kSampleEntries = kSampleChunks * 16;    // entries sampled a row (8,192)
constexpr int kSampleFactor = 2;                      // candidates expected: about this x k
constexpr int kSampleMin = 32;                        // sampled keys at or above tau, at least
}  // namespace select_fast

// Entry j of this thread's kPer entries of a chunk starting at `start`: runs of 4, so that
// they arrive by 16-byte loads.
template <int kThreads>
__device__ __forceinline__ int chunk_entry(int start, int j) {
    return start + ((j >> 2) * kThreads + (int)threadIdx.x) * 4 + (j & 3);
}

// This thread's kPer entries of a chunk of row r (16-byte aligned, n >= 1 entries), every
// load in flight at once: unconditional loads, since a load under a branch waits for the one
// before it; a vector past the row's end is replaced by the row's last one (discarded by the
// caller's i < n test).
template <int kThreads, int kPer>
__device__ __forceinline__ void load_chunk(const float* __restrict__ r, int start, int n, float (&v)[kPer]) {
    static_assert(kPer % 4 == 0, "whole 16-byte vectors");
    const float4* r4 = reinterpret_cast<const float4*>(r);
    const int last = (n - 1) >> 2;
#pragma unroll
    for (int q = 0; q < kPer / 4; ++q) {
        // ld.global.cg, not the read-only path: an ordinary load stays above the barriers
        // that follow (the compiler moved read-only ones below them, a second round trip)
        const float4 x = __ldcg(r4 + min((start >> 2) + q * kThreads + (int)threadIdx.x, last));
        v[4 * q] = x.x;
        v[4 * q + 1] = x.y;
        v[4 * q + 2] = x.z;
        v[4 * q + 3] = x.w;
    }
}

// grid (chunks, rows), kThreads threads, each CTA counts kPerThread * kThreads entries
// (rows 16-byte aligned: ld a multiple of 4). Chunks vary fastest: CTAs running together
// stream neighbouring parts of one row (rows 1 MB apart side by side read at a quarter of
// the bandwidth).
template <int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads)
topk_histogram_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                      u32* __restrict__ hist,  // [rows, kBins], zero at rest
                      u32* __restrict__ count)  // [rows] candidate counts, cleared here
{
    const int row = blockIdx.y;
    const int n = visible_len(valid_lens, row, max_len);  // before the wait: as topk_filter_kernel
    const int start = blockIdx.x * kThreads * kPerThread;
    if (start >= n) {
        wait_for_previous_grid();
        clear_candidate_counts(count, gridDim.y);
        return;
    }
    wait_for_previous_grid();  // the scores and counts come from the kernel before
    clear_candidate_counts(count, gridDim.y);
    using namespace select_fast;
    __shared__ u32 h[kBins];
    const float* r = scores + (long long)row * ld;
    float v[kPerThread];
    load_chunk<kThreads>(r, start, n, v);  // in flight while the bins are cleared (loads stay above the barrier)
    for (int i = threadIdx.x; i < kBins; i += kThreads) h[i] = 0u;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
        const int i = chunk_entry<kThreads>(start, j);
        const u32 key = score_to_key(v[j]);
        if (i < n && key) atomicAdd(&h[key >> kBinShift], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kBins; i += kThreads)
        if (h[i]) atomicAdd(&hist[(long long)row * kBins + i], h[i]);
}

// The m-th largest non-zero key among every thread's kPer keys (kThreads threads, all of
// them calling; zero keys never count), or 0 when fewer than m are non-zero: four 8-bit
// radix passes, most significant digit first. hist: 257 u32 of shared memory.
template <int kThreads, int kPer>
__device__ __forceinline__ u32 mth_largest_key(const u32 (&keys)[kPer], u32 m, u32* hist, u32* scratch,
                                               u32* s_bin, u32* s_above) {
    static_assert(kThreads >= 256, "a bin a thread (threads past 256 hold none)");
    const int tid = threadIdx.x;
    u32 prefix = 0u, mask = 0u, k_rem = m;
    for (int pass = 0; pass < 4; ++pass) {  // the same trip count in every thread
        const int shift = 24 - 8 * pass;
        for (int b = tid; b < 257; b += kThreads) hist[b] = 0u;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const bool match = keys[j] != 0u && (keys[j] & mask) == prefix;
            atomicAdd(&hist[match ? (keys[j] >> shift) & 255u : 256u], 1u);  // 256: not counted
        }
        __syncthreads();
        const int b = 255 - tid;  // thread t: bin 255 - t, so the scan runs from the top bin down
        const u32 cnt = tid < 256 ? hist[b] : 0u;
        u32 total;
        const u32 above = block_exclusive_scan<kThreads>(cnt, scratch, &total);
        if (pass == 0 && total < m) return 0u;  // the same in every thread
        if (above < k_rem && k_rem <= above + cnt) {  // exactly one thread
            *s_bin = (u32)b;
            *s_above = above;
        }
        __syncthreads();
        prefix |= *s_bin << shift;
        mask |= 255u << shift;
        k_rem -= *s_above;
        __syncthreads();  // s_bin, s_above read by every thread before the next pass sets them
    }
    return prefix;
}

// grid (rows,), kThreads (256) threads: row r's candidate threshold key tau[r], for runs
// whose scoring kernel counts no histogram (the keys-stationary kernel). kSampleChunks
// chunks of 16 consecutive entries spread evenly over the row (the whole row when it has at
// most kSampleEntries entries) are read, and tau is their m-th largest key, m set so that
// about kSampleFactor x k of the row's entries lie at or above it: the filter then takes
// every entry whose key is >= tau. When the sample is the row, m = k and tau is exactly the
// k-th largest key; else the count at or above tau is a random ~2k (relative spread
// 1/sqrt(m), m = 64 for k = 1,024 over 262,144 entries: below k about once in 30,000
// rows), and topk_final_kernel checks it: fewer than k (tau too high) or more than its
// buffer holds, and it selects that row from its scores instead. tau = 0 (fewer than m
// selectable sampled entries): every non-NaN entry is a candidate. Also clears the run's
// candidate counts (the kernel before the filter, as topk_histogram_kernel).
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
topk_sample_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                   int top_k, u32* __restrict__ count, u32* __restrict__ tau)
{
    wait_for_previous_grid();  // first: the scores and counts come from the kernel before (common.cuh)
    clear_candidate_counts(count, gridDim.x);
    using namespace select_fast;
    constexpr int kChunksPer = kSampleChunks / kThreads;  // chunks a thread
    constexpr int kPer = 16 * kChunksPer;                  // keys a thread
    static_assert(kChunksPer * kThreads == kSampleChunks, "whole chunks a thread");
    __shared__ u32 hist[257];
    __shared__ u32 scratch[32];
    __shared__ u32 s_bin, s_above;
    const int row = blockIdx.x, tid = threadIdx.x;
    const int n = visible_len(valid_lens, row, max_len);
    const bool whole = n <= kSampleEntries;  // the sample is the row
    const float4* r4 = reinterpret_cast<const float4*>(scores + (long long)row * ld);
    const long long ld4 = ld >> 2;  // ld a multiple of 4, >= 4
    u32 keys[kPer];
#pragma unroll
    for (int c = 0; c < kChunksPer; ++c) {
        const int chunk = c * kThreads + tid;
        // 16-entry aligned starts, distinct (n / kSampleChunks > 16 when not whole), inside the row
        const int start = whole ? 16 * chunk : (int)(((long long)chunk * n / kSampleChunks) & ~15ll);
        float4 v[4];  // past the row's ld (a whole row shorter than the sample): its last vector again
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = __ldcg(r4 + min((long long)(start >> 2) + q, ld4 - 1));
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int i = start + 4 * q;
            keys[16 * c + 4 * q] = i < n ? score_to_key(v[q].x) : 0u;
            keys[16 * c + 4 * q + 1] = i + 1 < n ? score_to_key(v[q].y) : 0u;
            keys[16 * c + 4 * q + 2] = i + 2 < n ? score_to_key(v[q].z) : 0u;
            keys[16 * c + 4 * q + 3] = i + 3 < n ? score_to_key(v[q].w) : 0u;
        }
    }
    // at least kSampleMin sampled keys above tau, so that the count's spread stays small
    // for small k too (more candidates then, ~kSampleMin x n / kSampleEntries)
    const u32 m = whole ? (u32)top_k
                        : (u32)min((long long)kSampleEntries,
                                   max((long long)kSampleMin,
                                       ((long long)kSampleFactor * top_k * kSampleEntries + n - 1) / n));
    const u32 t = mth_largest_key<kThreads, kPer>(keys, m, hist, scratch, &s_bin, &s_above);
    if (tid == 0) tau[row] = t;
}

// Thread tid's kPer = kN / kThreads bins of h[0, kN), highest first (bins kN-1-kPer*tid-j,
// j = 0 .. kPer-1), into own[], and how many entries lie in the bins above them (an
// exclusive scan over the threads); *total: all entries. All kThreads threads call it; it
// ends with a barrier.
template <int kThreads, int kN, int kPer>
__device__ __forceinline__ u32 descending_bins(const u32* h, u32 (&own)[kPer], u32* scratch, u32* total) {
    static_assert(kPer * kThreads == kN, "whole bins a thread");
    u32 sum = 0u;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        own[j] = h[kN - 1 - (kPer * (int)threadIdx.x + j)];
        sum += own[j];
    }
    return block_exclusive_scan<kThreads>(sum, scratch, total);
}

// A thread's eight bins of a row's histogram, as two 16-byte loads (issued by load_bins,
// read by threshold_bin, so that a caller can put other loads in flight between the two)
struct RowBins {
    uint4 lo, hi;  // bins 2040 - 8 tid .. 2047 - 8 tid, ascending
};

template <int kThreads>
__device__ __forceinline__ RowBins load_bins(const u32* __restrict__ h) {
    static_assert(select_fast::kBins / kThreads == 8, "two 16-byte loads of bins a thread");
    const uint4* h4 = reinterpret_cast<const uint4*>(h + select_fast::kBins - 8 * ((int)threadIdx.x + 1));
    return RowBins{h4[0], h4[1]};
}

// The bin b* of a row's histogram that holds its k-th best key, or 0 when the row has at
// most k selectable entries (then every non-NaN entry is a candidate), from each thread's
// kPer bins `mine`, highest first: thread tid holds bins 2047 - kPer tid - j, j = 0 ..
// kPer - 1. All kThreads threads of the CTA call it and get the same value; it has two
// barriers, the first before any thread returns. A warp scans its threads' sums by
// shuffles, and every thread adds the warp totals before its own from shared memory: one
// barrier where a block-wide scan takes three (the filter, a few microseconds of
// latency-bound CTAs, runs this in every CTA of a row).
// s_top (the streamed select): also the highest non-empty bin into *s_top (left as it was
// when every bin is empty), seen by every thread on return: then both barriers always run.
template <int kThreads, int kPer>
__device__ __forceinline__ u32 threshold_bin_of(const u32 (&mine)[kPer], int top_k, u32* scratch, u32* s_bin,
                                                u32* s_top = nullptr) {
    using namespace select_fast;
    static_assert(kPer * kThreads == kBins && kThreads / 32 <= 32, "whole bins a thread, a scratch slot a warp");
    constexpr int kWarps = kThreads / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u32 sum = 0u;
#pragma unroll
    for (int j = 0; j < kPer; ++j) sum += mine[j];
    const u32 incl = warp_inclusive_scan(sum);  // over the warp's lanes (lane 0: the highest bins)
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    // the warps' totals scanned by every warp, a total a lane (one load a thread where each
    // thread summing all kWarps of them took 32 loads at 1,024 threads: ~0.8 us of the
    // streamed select's threshold; docs/performance.md v75)
    const u32 t = lane < kWarps ? scratch[lane] : 0u;
    const u32 t_incl = warp_inclusive_scan(t);
    const u32 total = __shfl_sync(FULL_MASK, t_incl, 31);  // entries in all bins
    u32 above = incl - sum + __shfl_sync(FULL_MASK, t_incl - t, warp);  // entries in the bins above mine
    if (s_top == nullptr && total <= (u32)top_k) return 0u;  // the same in every thread
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        if (above < (u32)top_k && (u32)top_k <= above + mine[j]) *s_bin = (u32)(kBins - 1 - (kPer * tid + j));
        if (s_top != nullptr && above == 0u && mine[j] != 0u) *s_top = (u32)(kBins - 1 - (kPer * tid + j));  // one bin
        above += mine[j];
    }
    __syncthreads();
    return total <= (u32)top_k ? 0u : *s_bin;
}

// threshold_bin_of for the filter's 256 threads, from load_bins' two 16-byte loads
template <int kThreads>
__device__ __forceinline__ u32 threshold_bin(const RowBins& bins, int top_k, u32* scratch, u32* s_bin) {
    static_assert(select_fast::kBins / kThreads == 8, "two 16-byte loads of bins a thread");
    const uint4 lo = bins.lo, hi = bins.hi;
    const u32 mine[8] = {hi.w, hi.z, hi.y, hi.x, lo.w, lo.z, lo.y, lo.x};  // highest first
    return threshold_bin_of<kThreads, 8>(mine, top_k, scratch, s_bin);
}

// A row's histogram is zero at rest: the scoring kernels and the histogram kernel only add
// to it, and the select's last kernel for the row (rank or final) clears it in its CTA 0
// (the filter that read it has ended: that kernel waited for it), so a call on a Workspace
// needs no fill before it (indexer/workspace.py: `zeroed`). The candidate counts are
// cleared by the kernel before the filter instead (clear_candidate_counts, common.cuh).
template <int kThreads>
__device__ __forceinline__ void clear_row_histogram(u32* __restrict__ hist_row) {
    if (blockIdx.y == 0)
        for (int i = threadIdx.x; i < select_fast::kBins; i += kThreads) hist_row[i] = 0u;
}

// grid (chunks, rows): append every entry whose key bin is >= b* (threshold_bin of the row's
// histogram, found by every CTA of the row while its scores are in flight: one launch less
// than a kernel of its own) to the row's buffer.
// kSampled: the threshold is the row's key tau[row] (topk_sample_kernel; `hist` is tau
// then), every entry with a key >= it a candidate.
template <int kThreads, int kPerThread, bool kSampled = false>
__global__ void __launch_bounds__(kThreads, kSampled ? 8 : 0)  // kSampled: 32 registers, 8 CTAs a SM (0: no bound)
topk_filter_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                   const u32* __restrict__ hist, int top_k, u32* __restrict__ count, u64* __restrict__ cand, int cap)
{
    const int row = blockIdx.y;
    TIMELINE_POINT(0, true);  // points 0-4 (scripts/probe_timeline.py --whole): entry
    // The row's length, an input of the call, is loaded before the wait (common.cuh): where
    // this CTA was placed while the kernel before was ending, its chunk's loads go out as
    // soon as the wait ends, one round trip earlier. The wait sits on each side of the early
    // exit's branch, so that it follows the length's load (with one wait after the branch,
    // ptxas hoisted it above the load: nothing held it there).
    const int n = visible_len(valid_lens, row, max_len);
    const int start = blockIdx.x * kThreads * kPerThread;
    if (start >= n) {
        wait_for_previous_grid();
        return;
    }
    wait_for_previous_grid();  // the scores and the threshold come from the kernels before
    TIMELINE_POINT(1, true);  // past the wait
    using namespace select_fast;
    static_assert(kThreads == 256, "threshold_bin splits the 2048 bins over 256 threads");
    __shared__ u32 s_taken, s_base, s_bin;
    __shared__ u32 scratch[32];
    if (threadIdx.x == 0) s_taken = 0u;
    const float* r = scores + (long long)row * ld;
    u64* out = cand + (long long)row * cap;
    const int lane = threadIdx.x & 31;
    float v[kPerThread];
    load_chunk<kThreads>(r, start, n, v);
    u32 thr;  // candidates: keys >= thr (kSampled), else keys in bins >= thr
    if constexpr (kSampled) {
        thr = hist[row];  // tau
        __syncthreads();  // s_taken = 0 visible (threshold_bin's barrier does this otherwise)
    } else {
        const RowBins bins = load_bins<kThreads>(hist + (long long)row * kBins);  // in flight with the scores
        thr = threshold_bin<kThreads>(bins, top_k, scratch, &s_bin);
    }
    TIMELINE_POINT(2, true);  // the threshold found
    // candidates compared as scores against the threshold key's bound (score_bound_of_key:
    // one compare an entry where a key takes several; NaN never passes)
    const float bound = score_bound_of_key(kSampled ? thr : thr << kBinShift);
    u32 takes = 0u;  // bit j: entry j of this thread is a candidate
#pragma unroll
    for (int j = 0; j < kPerThread; ++j)
        if (chunk_entry<kThreads>(start, j) < n && v[j] >= bound) takes |= 1u << j;
    // a lane's candidates go to consecutive slots: its offset in the warp's by a scan of the
    // lanes' counts, the warp's in the CTA's by one shared atomic, the CTA's in the row's by
    // one global atomic (not one a warp: the rows' counters share a cache line, so a thousand
    // atomics a row would queue behind each other in one L2 slice); no ballot an entry
    const u32 taken = __popc(takes);
    const u32 incl = warp_inclusive_scan(taken);
    const u32 warp_taken = __shfl_sync(FULL_MASK, incl, 31);
    // s_taken = 0 is visible: threshold_bin's first barrier came after thread 0 set it, and
    // its last one after every thread read the scratch it shares with nothing here
    u32 warp_base = 0u;
    if (lane == 31 && warp_taken) warp_base = atomicAdd(&s_taken, warp_taken);
    __syncthreads();
    if (threadIdx.x == 0 && s_taken) s_base = atomicAdd(&count[row], s_taken);
    __syncthreads();
    TIMELINE_POINT(3, true);  // the CTA's candidates counted into the row's
    // the next kernel's CTAs may be placed now, while this grid appends its candidates (they
    // wait for this grid's end before they read any): its placement under this tail
    let_next_grid_start();
    if (warp_taken == 0u) return;  // the same in every lane; no barrier follows
    u32 p = s_base + __shfl_sync(FULL_MASK, warp_base, 31) + incl - taken;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
        if ((takes >> j) & 1u) {
            const int i = chunk_entry<kThreads>(start, j);
            if constexpr (kSampled) {
                // the score read again (an L2 hit: this CTA read it a moment ago), so that the
                // chunk's registers are free before the count's atomic: 32 registers a thread,
                // eight CTAs a SM where 48 allowed five (more of the row's reads in flight)
                if (p < (u32)cap) out[p] = make_candidate(score_to_key_not_nan(__ldcg(r + i)), i);
            } else {
                if (p < (u32)cap) out[p] = make_candidate(score_to_key_not_nan(v[j]), i);
            }
            ++p;
        }
    }
    TIMELINE_POINT(4, true);  // this warp's candidates appended (warps with none stop at 3)
}

// The width of the fine key bins over keys [lo, hi]: bins (key >> shift) - (lo >> shift),
// at most kRankBins of them (the top one clamped: rank_bin_of).
__device__ __forceinline__ int rank_bin_shift(u32 lo, u32 hi) {
    return max(0, (32 - __clz((int)(hi - lo))) - 10);  // (hi - lo) >> shift < kRankBins
}

__device__ __forceinline__ u32 rank_bin_of(u32 key, u32 lo, int shift) {
    return min((key >> shift) - (lo >> shift), (u32)(select_fast::kRankBins - 1));
}

// The ranks of a row's cnt candidates c[0, cnt) (shared memory, distinct keys, every key in
// [lo, ...)) among themselves, from their fine key bins' counts in bin_pos[0, kRankBins)
// (rank_bin_of(key, lo, shift)): a scan from the highest bin down, a scatter of buffer
// positions into by_bin, and each candidate at positions me0, me0 + stride, ... compared
// with those of its own bin, written to its output slot when it ranks below top_k. Called
// by every thread of the CTA after a barrier that follows the counts and c.
template <int kThreads>
__device__ __forceinline__ void rank_in_counted_bins(const u64* c, u32 cnt, u32 lo, int shift, u32 me0, u32 stride,
                                                     unsigned short* by_bin, u32* bin_pos, u32* scratch, int top_k,
                                                     const int* __restrict__ bt_row, int E, int num_blocks,
                                                     int physical, int* __restrict__ oi, float* __restrict__ os) {
    using namespace select_fast;
    constexpr int kPer = kRankBins / kThreads;
    static_assert(kPer * kThreads == kRankBins, "whole bins a thread");
    const int tid = threadIdx.x;
    {
        u32 own[kPer], total;
        u32 pos = descending_bins<kThreads, kRankBins>(bin_pos, own, scratch, &total);  // ends with a barrier
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            bin_pos[kRankBins - 1 - (kPer * tid + j)] = pos;
            pos += own[j];
        }
    }
    __syncthreads();
    for (u32 i = tid; i < cnt; i += kThreads)
        by_bin[atomicAdd(&bin_pos[rank_bin_of(candidate_key(c[i]), lo, shift)], 1u)] = (unsigned short)i;
    __syncthreads();
    // ---- ranks: bin b holds by_bin[bin_pos[b + 1] .. bin_pos[b]) (from 0 for the top bin)
    for (u32 me = me0; me < cnt; me += stride) {
        const u64 mine = c[me];
        const u32 b = rank_bin_of(candidate_key(mine), lo, shift);
        const u32 first = b + 1u < (u32)kRankBins ? bin_pos[b + 1] : 0u, last = bin_pos[b];
        u32 rank = first;  // every candidate of a higher bin orders before it
        for (u32 j = first; j < last; ++j) rank += c[by_bin[j]] > mine;
        if (rank < (u32)top_k) write_slot(rank, mine, true, bt_row, E, num_blocks, physical, oi, os);
    }
}

// The ranks of a row's cnt candidates c[0, cnt) (shared memory, distinct keys) among
// themselves, by fine key bins (topk_rank_kernel's layout: the keys' span [kmin, kmax]
// cut into at most kRankBins power-of-two-wide bins, a count, then rank_in_counted_bins),
// each candidate at positions me0, me0 + stride, ... written to its output slot when it
// ranks below top_k. Called by every thread of the CTA with its own kmin / kmax of the
// candidates it placed in c, after a barrier that follows: bin_pos[0, kRankBins) zero,
// *s_min = ~0, *s_max = 0, and c filled.
template <int kThreads>
__device__ __forceinline__ void rank_in_fine_bins(const u64* c, u32 cnt, u32 kmin, u32 kmax, u32 me0, u32 stride,
                                                  unsigned short* by_bin, u32* bin_pos, u32* scratch, u32* s_min,
                                                  u32* s_max, int top_k, const int* __restrict__ bt_row, int E,
                                                  int num_blocks, int physical, int* __restrict__ oi,
                                                  float* __restrict__ os) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        kmin = min(kmin, __shfl_xor_sync(FULL_MASK, kmin, off));
        kmax = max(kmax, __shfl_xor_sync(FULL_MASK, kmax, off));
    }
    if ((tid & 31) == 0) {
        atomicMin(s_min, kmin);
        atomicMax(s_max, kmax);
    }
    __syncthreads();
    const u32 lo = *s_min;
    const int shift = rank_bin_shift(lo, *s_max);
    for (u32 i = tid; i < cnt; i += kThreads) atomicAdd(&bin_pos[rank_bin_of(candidate_key(c[i]), lo, shift)], 1u);
    __syncthreads();
    rank_in_counted_bins<kThreads>(c, cnt, lo, shift, me0, stride, by_bin, bin_pos, scratch, top_k, bt_row, E,
                                   num_blocks, physical, oi, os);
}


// grid (rows, G), kThreads threads: the CTAs of a row rank its candidates. Keys are unique
// (the index is part of them), so a candidate's rank (how many of the row's candidates
// order before it) is its output slot, whatever order the atomics gave the buffer; every
// CTA ranks by buffer position, the same in all of them, so each candidate is ranked
// exactly once. CTA 0 of a row writes the -1 / -inf padding. A row with more than kRankMax
// candidates (a plateau of ties at the k-th key, never seen on random rows) is taken whole
// by its CTA 0 with the exact radix select over its scores (select_row.cuh), so a run that
// ranks needs no topk_final_kernel launch. Two ways to count a rank:
// kAllPairs (runs of very few rows, many CTAs a row): warp w of CTA y ranks the candidates
// at buffer positions g * kWarps + w, g = y, y + G, ..., each against every candidate of
// the row, its lanes taking every 32nd: cnt^2 compares a row in all, spread over the
// whole GPU, and no shared-memory layout before them (a batch-1 call's ~1,500 candidates:
// ~50 compares a lane a candidate).
// Otherwise (fine key bins; more rows, G = 2 x top_k / kThreads CTAs a row, half that where
// the grid would not fit one wave: geometry.rank_ctas_per_row): CTA y ranks the candidates
// at buffer positions [kThreads * g, kThreads * (g + 1)) for g = y, y + G, ... (one a
// thread, a turn). Every CTA first lays all of the row's candidates out in shared
// memory by fine key bin: the keys' span [kmin, kmax] cut into at most kRankBins
// power-of-two-wide bins ((key >> s) - (kmin >> s), the top one clamped), a count, a scan
// from the highest bin down, a scatter of buffer positions. A candidate's rank is where its bin starts plus the
// candidates of its own bin that order before it: on rows of distinct scores a bin holds a
// few candidates, where comparing every pair (the 11-bit histogram bins are too coarse:
// decode's ~1,500 candidates of a row fall into 2-3 of them) cost O(count^2). Equal keys
// share a bin at any width: a plateau of m ties costs m compares a candidate (m <=
// kRankMax).
template <int kThreads, bool kAllPairs>
__global__ void __launch_bounds__(kThreads, 4)  // 4 CTAs per SM (47 KB of shared memory each; 34 all-pairs)
topk_rank_kernel(const float* __restrict__ scores, long long ld,
                 const int* __restrict__ valid_lens, int max_len, u32* __restrict__ hist,
                 const u32* __restrict__ count, const u64* __restrict__ cand, int cap, int top_k,
                 const int* __restrict__ block_table, int L, int E, int num_blocks, int physical,
                 int* __restrict__ out_idx, float* __restrict__ out_scores)
{
    TIMELINE_POINT(0, true);  // points 0-3 (scripts/probe_timeline.py --whole): entry
    wait_for_previous_grid();  // first: the scores and counts come from the kernel before (common.cuh)
    TIMELINE_POINT(1, true);  // past the wait
    using namespace select_fast;
    __shared__ u64 c[kRankMax];                    // the row's candidates in buffer order
    __shared__ unsigned short by_bin[kRankMax];    // their positions in c, highest bin first
    __shared__ u32 bin_pos[kRankBins];             // per bin: count, then first slot, then end
    __shared__ u32 scratch[32];
    __shared__ u32 s_min, s_max;
    const int row = blockIdx.x, tid = threadIdx.x;
    // The row's length, its candidate count and its first kFirst candidate slots are loaded
    // together, before any of them is known (slots past the count hold stale values and are
    // never used; cap >= kFirst): one round trip where the count waited for the length and
    // the candidates for the count.
    // All-pairs ranking reads twice as many at once: a batch-1 row's ~1,500 candidates in
    // that one round trip.
    constexpr int kFirstPer = kAllPairs ? 8 : 4;
    constexpr int kFirst = kFirstPer * kThreads;
    constexpr int kWarps = kThreads / 32;
    const u64* src = cand + (long long)row * cap;
    u64 first[kFirstPer];
#pragma unroll
    for (int q = 0; q < kFirstPer; ++q)  // volatile: issued here, not sunk below the count's tests
        asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(first[q]) : "l"(src + q * kThreads + tid));
    const u32 count_row = count[row];
    const int n = visible_len(valid_lens, row, max_len);
    const u32 cnt = n > 0 ? count_row : 0u;
    clear_row_histogram<kThreads>(hist + (long long)row * kBins);
    const int* bt_row = block_table + (long long)row * L;
    int* oi = out_idx + (long long)row * top_k;
    float* os = out_scores ? out_scores + (long long)row * top_k : nullptr;
    if (cnt > (u32)kRankMax) {  // the same in every thread of the CTA
        if (blockIdx.y == 0)
            select_row_radix<kThreads, kRankMax>(scores + (long long)row * ld, n, top_k, bt_row, E, num_blocks,
                                                 physical, oi, os, c);
        return;
    }
    const u32 m = cnt < (u32)top_k ? cnt : (u32)top_k;
    if (blockIdx.y == 0)
        for (int i = (int)m + tid; i < top_k; i += kThreads) write_slot(i, 0ull, false, bt_row, E, num_blocks, physical, oi, os);
    if (blockIdx.y * (kAllPairs ? kWarps : kThreads) >= cnt) return;  // nothing to rank here
    if constexpr (!kAllPairs) {
        if (tid == 0) {
            s_min = ~0u;
            s_max = 0u;
        }
        for (int i = tid; i < kRankBins; i += kThreads) bin_pos[i] = 0u;
        __syncthreads();
    }
    // ---- the candidates into shared memory, and (fine bins) their key span
    u32 kmin = ~0u, kmax = 0u;
    for (u32 base = 0; base < cnt; base += kFirst) {  // kFirstPer loads in flight per thread
        u64 x[kFirstPer];
#pragma unroll
        for (int q = 0; q < kFirstPer; ++q) x[q] = base == 0 ? first[q] : src[min(base + q * kThreads + tid, cnt - 1u)];
#pragma unroll
        for (int q = 0; q < kFirstPer; ++q) {
            const u32 i = base + q * kThreads + tid;
            if (i < cnt) {
                kmin = min(kmin, candidate_key(x[q]));
                kmax = max(kmax, candidate_key(x[q]));
                c[i] = x[q];
            }
        }
    }
    TIMELINE_POINT(2, true);  // this warp's candidates loaded (stored to shared memory)
    if constexpr (kAllPairs) {
        // zero keys up to a whole 128 (no candidate has key 0, so none orders before any):
        // the compare loop below then runs without bounds tests, four loads in flight a lane
        const u32 padded = (cnt + 127u) & ~127u;  // <= kRankMax
        for (u32 i = cnt + tid; i < padded; i += kThreads) c[i] = 0ull;
        __syncthreads();
        const int warp = tid >> 5, lane = tid & 31;
        for (u32 me = blockIdx.y * kWarps + warp; me < cnt; me += gridDim.y * kWarps) {
            const u64 mine = c[me];
            u32 b0 = 0u, b1 = 0u, b2 = 0u, b3 = 0u;  // this lane's candidates ordering before it
            for (u32 j = lane; j < padded; j += 128) {
                b0 += c[j] > mine;
                b1 += c[j + 32] > mine;
                b2 += c[j + 64] > mine;
                b3 += c[j + 96] > mine;
            }
            const u32 rank = __reduce_add_sync(FULL_MASK, (b0 + b1) + (b2 + b3));
            if (lane == 0 && rank < (u32)top_k) write_slot(rank, mine, true, bt_row, E, num_blocks, physical, oi, os);
        }
        TIMELINE_POINT(3, true);  // ranked
        return;
    }
    rank_in_fine_bins<kThreads>(c, cnt, kmin, kmax, blockIdx.y * kThreads + tid, gridDim.y * kThreads, by_bin, bin_pos,
                                scratch, &s_min, &s_max, top_k, bt_row, E, num_blocks, physical, oi, os);
    TIMELINE_POINT(3, true);  // ranked
}

// grid (rows,), kThreads (1,024) threads, row_stream_smem() bytes of dynamic shared memory:
// the whole select of a row in one CTA, from its histogram and its scores, for runs of
// about an SM's worth of rows or more (geometry.row_stream_select). The bin b* of the k-th
// best key (threshold_bin_of, two bins a thread), then the row streamed through chunks of
// kPer entries a thread, kStages - 1 chunks in flight ahead of the one compared, each
// thread copying (cp.async) exactly the entries it reads, into slots of its own: no
// barrier a chunk, no registers held by the copies; every entry of a bin >= b* is gathered
// into shared memory and counted in its fine key bin as it is (their span, from b*'s start
// to the top non-empty bin's end, is known from the histogram), and the CTA ranks what it
// gathered within those bins (rank_in_counted_bins). No candidate buffer, count or second
// launch in global memory, and the filter's per-CTA chain (the histogram's scan, the
// count's atomic) runs once a row, not once a 4,096-entry chunk. A row with more than
// kRankMax candidates (a plateau of ties at the k-th key) is selected from its scores by
// the radix select. Clears the row's histogram (zero at rest) once every thread has read
// its bins.
namespace row_stream {
constexpr int kPer = 8;      // entries a thread a chunk: two 16-byte copies
constexpr int kStages = 4;   // chunks in the ring: kStages - 1 in flight while one is compared
}  // namespace row_stream

// dynamic shared memory of topk_row_stream_kernel<kThreads>: the ring, which the ranking's
// layout (by_bin, bin_pos) takes over once the row has streamed through
template <int kThreads>
__host__ __device__ constexpr int row_stream_smem() {
    return row_stream::kStages * row_stream::kPer * kThreads * 4;
}

template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1)
topk_row_stream_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                       u32* __restrict__ hist, int top_k, const int* __restrict__ block_table, int L, int E,
                       int num_blocks, int physical, int* __restrict__ out_idx, float* __restrict__ out_scores)
{
    using namespace select_fast;
    using row_stream::kPer;
    using row_stream::kStages;
    constexpr int kBinsPer = kBins / kThreads;
    constexpr int kChunk = kThreads * kPer;
    constexpr int kQuads = kPer / 4;
    static_assert(kBinsPer == 2 && kRankBins == kThreads, "two histogram bins and one fine bin a thread");
    static_assert(kRankMax * 2 <= row_stream_smem<kThreads>(), "by_bin fits the ring");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float4* ring = reinterpret_cast<float4*>(smem_raw);  // [kStages][kQuads][kThreads]
    unsigned short* by_bin = reinterpret_cast<unsigned short*>(smem_raw);  // after the stream
    __shared__ u64 c[kRankMax];  // the row's candidates, in arrival order
    // the candidates' fine key bins (rank_bin_of), counted as they are gathered: their span
    // is known before the stream (from b*'s start to the top non-empty bin's end), so the
    // ranking needs no min / max reduction and no counting pass after it
    __shared__ u32 bin_pos[kRankBins];
    __shared__ u32 scratch[32];
    __shared__ u32 s_top, s_bin, s_taken;
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
    TIMELINE_POINT(0, true);
    const int n = visible_len(valid_lens, row, max_len);  // an input: loaded before the wait
    // this CTA's own state, set while the kernel before ends (threshold_bin_of's barriers
    // make it seen)
    if (tid == 0) {
        s_taken = 0u;
        s_top = 0u;
    }
    bin_pos[tid] = 0u;  // kRankBins == kThreads
    wait_for_previous_grid();  // the scores and the histogram come from the kernel before
    TIMELINE_POINT(1, true);
    const float* r = scores + (long long)row * ld;
    u32* hist_row = hist + (long long)row * kBins;
    // chunk ch's quad h of this thread: entries ch * kChunk + (h * kThreads + tid) * 4 + 0..3,
    // copied where it starts below n (it then ends inside the row's ld: rows are 16-byte
    // aligned and ld a multiple of 4), zeros elsewhere; one group a chunk, empty past the row
    auto issue = [&](int ch) {
#pragma unroll
        for (int h = 0; h < kQuads; ++h) {
            const int first = ch * kChunk + (h * kThreads + tid) * 4;
            if (ch * kChunk < n)  // the same in every thread
                cp_async_16(ring + ((ch % kStages) * kQuads + h) * kThreads + tid, r + min(first, n - 1 - (n - 1) % 4),
                            first < n);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int ch = 0; ch < kStages - 1; ++ch) issue(ch);  // in flight with the bins
    const uint2 hb = reinterpret_cast<const uint2*>(hist_row)[kBins / 2 - 1 - tid];  // bins 2046 - 2 tid, + 1
    const u32 mine[kBinsPer] = {hb.y, hb.x};  // highest first
    // its barriers: the above seen, s_top set
    const u32 thr = threshold_bin_of<kThreads, kBinsPer>(mine, top_k, scratch, &s_bin, &s_top);
    reinterpret_cast<uint2*>(hist_row)[kBins / 2 - 1 - tid] = make_uint2(0u, 0u);  // every thread's bins read
    TIMELINE_POINT(2, true);
    const int* bt_row = block_table + (long long)row * L;
    int* oi = out_idx + (long long)row * top_k;
    float* os = out_scores ? out_scores + (long long)row * top_k : nullptr;
    // the candidates, keys in a bin >= thr, compared as scores (score_bound_of_key): one
    // compare an entry where a key takes several instructions
    const float fthr = score_bound_of_key(thr << kBinShift);
    // every candidate's key in [lo, hi] (one above hi, -0 counted as +0, lands in the top
    // fine bin, which is clamped: the bins stay in key order)
    const u32 lo = thr << kBinShift, hi = ((s_top + 1u) << kBinShift) - 1u;
    const int shift = rank_bin_shift(lo, hi);
    for (int ch = 0; ch * kChunk < n; ++ch) {  // the same trip count in every thread
        // into the slots this thread read at chunk ch - 1 (its own reads, done in order)
        issue(ch + kStages - 1);
        cp_async_wait<kStages - 1>();  // this thread's copies of chunk ch have landed
        float v[kPer];
#pragma unroll
        for (int h = 0; h < kQuads; ++h) {
            const float4 x = ring[((ch % kStages) * kQuads + h) * kThreads + tid];
            v[4 * h] = x.x;
            v[4 * h + 1] = x.y;
            v[4 * h + 2] = x.z;
            v[4 * h + 3] = x.w;
        }
        auto offset = [&](int j) { return ((j >> 2) * kThreads + tid) * 4 + (j & 3); };  // in the chunk
        const int lim = n - ch * kChunk;  // the chunk's entries below n
        u32 takes = 0u;  // bit j: entry j of this thread is a candidate
#pragma unroll
        for (int j = 0; j < kPer; ++j)
            if (offset(j) < lim && v[j] >= fthr) takes |= 1u << j;
        // a lane's candidates go to consecutive slots: its offset in the warp's by a scan of
        // the lanes' counts, the warp's by one atomic; then every entry's store predicated
        // on its own bit (a ballot a candidate entry, as the filter has, cost ~4x the
        // instructions a chunk: the kernel is issue-bound where about every warp takes a few)
        const u32 taken = __popc(takes);
        const u32 incl = warp_inclusive_scan(taken);
        const u32 warp_taken = __shfl_sync(FULL_MASK, incl, 31);
        if (warp_taken) {  // the same in every lane
            u32 base = 0u;
            if (lane == 31) base = atomicAdd(&s_taken, warp_taken);
            u32 p = __shfl_sync(FULL_MASK, base, 31) + incl - taken;
            // my candidates in order, one trip each (a lane takes ~0.2 a chunk): its entry
            // picked from v by a tree of selects on j's bits, where a trip for every one of
            // the kPer entries, each under its own bit, cost ~150 instructions a warp and
            // chunk (docs/performance.md v75)
            for (u32 t = takes; t != 0u; t &= t - 1u) {
                const int j = __ffs(t) - 1;
                float x[kPer];
#pragma unroll
                for (int i = 0; i < kPer; ++i) x[i] = v[i];
#pragma unroll
                for (int half = kPer / 2, bit = 1; half >= 1; half /= 2, bit *= 2) {
                    // level by level: x[i] = the entry of the j's with low bits i, lowest first
#pragma unroll
                    for (int i = 0; i < half; ++i) x[i] = (j & bit) ? x[2 * i + 1] : x[2 * i];
                }
                const u32 key = score_to_key_not_nan(x[0]);  // a candidate: never NaN
                atomicAdd(&bin_pos[rank_bin_of(key, lo, shift)], 1u);
                if (p < (u32)kRankMax) c[p] = make_candidate(key, ch * kChunk + offset(j));
                ++p;
            }
        }
    }
    cp_async_wait<0>();  // nothing in flight into the ring (the groups past the row are empty)
    __syncthreads();     // every candidate in c; every read of the ring done
    TIMELINE_POINT(3, true);
    const u32 cnt = s_taken;
    TIMELINE_TILES(cnt);
    if (cnt > (u32)kRankMax) {  // the same in every thread
        select_row_radix<kThreads, kRankMax>(r, n, top_k, bt_row, E, num_blocks, physical, oi, os, c);
        return;
    }
    const u32 m = cnt < (u32)top_k ? cnt : (u32)top_k;
    for (int i = (int)m + tid; i < top_k; i += kThreads) write_slot(i, 0ull, false, bt_row, E, num_blocks, physical, oi, os);
    if (cnt == 0u) return;  // the same in every thread
    rank_in_counted_bins<kThreads>(c, cnt, lo, shift, (u32)tid, (u32)kThreads, by_bin, bin_pos, scratch, top_k, bt_row,
                                   E, num_blocks, physical, oi, os);
    TIMELINE_POINT(4, true);
}

// One CTA per row, for runs whose candidates are not ranked (topk_rank_kernel takes the
// others whole): sort them (cut to the k-th key first), or, where they overflowed the
// buffer, the full-row radix select.
// kSampled: the candidates are the keys >= tau[row] (topk_sample_kernel, tau non-null), a
// superset of the winners only when there are at least k of them (or tau is 0: every
// selectable entry), so a row with fewer is selected from its scores too; `hist` is unused.
template <int kThreads, int kCap, bool kSampled = false>
__global__ void __launch_bounds__(kThreads)
topk_final_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                  u32* __restrict__ hist, const u32* __restrict__ count, const u64* __restrict__ cand, int top_k,
                  const int* __restrict__ block_table, int L, int E, int num_blocks, int physical,
                  int* __restrict__ out_idx, float* __restrict__ out_scores,
                  const u32* __restrict__ tau)  // [rows] (kSampled), else unused
{
    wait_for_previous_grid();  // first: the scores and counts come from the kernel before (common.cuh)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    u64* buf = reinterpret_cast<u64*>(smem_raw);  // kCap
    const int row = blockIdx.x, tid = threadIdx.x;
    const int n = visible_len(valid_lens, row, max_len);
    const u32 cnt = n > 0 ? count[row] : 0u;
    if constexpr (!kSampled)  // sampled runs have no histograms (the launcher allocates none)
        clear_row_histogram<kThreads>(hist + (long long)row * select_fast::kBins);  // one CTA a row
    const int* bt_row = block_table + (long long)row * L;
    int* oi = out_idx + (long long)row * top_k;
    float* os = out_scores ? out_scores + (long long)row * top_k : nullptr;
    // the buffer overflowed, or (kSampled) tau was above the k-th key: exact select over the whole row
    if (cnt > (u32)kCap || (kSampled && n > 0 && cnt < (u32)top_k && tau[row] != 0u)) {
        select_row_radix<kThreads, kCap>(scores + (long long)row * ld, n, top_k, bt_row, E, num_blocks, physical,
                                         oi, os, buf);
        return;
    }
    const u64* src = cand + (long long)row * kCap;
    u32 keep = cnt;  // candidates sorted
    if (sort_size(cnt) > sort_size((u32)top_k)) {  // the same in every thread
        // more candidates than the winners' sort needs (the sampled threshold's ~2 k, the
        // histogram bin's ~1.5 k): the k-th largest key among them (radix passes in shared
        // memory), then only those at or above it sorted (k and its ties), a sort of k keys
        // where there were 2 k or 4 k
        __shared__ u32 t_hist[257], t_scratch[32], t_bin, t_above, t_kept;
        constexpr int kPer = kCap / kThreads;
        static_assert(kPer * kThreads == kCap, "whole candidates a thread");
        u64 c[kPer];
        u32 keys[kPer];
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const u32 i = (u32)(j * kThreads + tid);
            c[j] = i < cnt ? src[i] : 0ull;
            keys[j] = candidate_key(c[j]);  // 0 past cnt: never counted, never kept
        }
        if (tid == 0) t_kept = 0u;
        const u32 kth = mth_largest_key<kThreads, kPer>(keys, (u32)top_k, t_hist, t_scratch, &t_bin, &t_above);
#pragma unroll
        for (int j = 0; j < kPer; ++j)  // kth > 0: at least k non-zero keys (cnt > k)
            if (keys[j] != 0u && keys[j] >= kth) buf[atomicAdd(&t_kept, 1u)] = c[j];
        __syncthreads();
        keep = t_kept;  // >= k
    } else {
        for (u32 i = tid; i < cnt; i += kThreads) buf[i] = src[i];
    }
    const u32 size = sort_size(keep);  // keep <= kCap; zero keys sort last
    for (u32 i = keep + tid; i < size; i += kThreads) buf[i] = 0ull;
    __syncthreads();
    bitonic_sort_desc<kThreads>(buf, size);
    const u32 m = keep < (u32)top_k ? keep : (u32)top_k;
    for (int i = tid; i < top_k; i += kThreads) write_winner(i, m, buf, bt_row, E, num_blocks, physical, oi, os);
}

// select_row_radix as a function of its own, for each of the row kernel's forms: inlined
// together in one body, the kernel's registers spilled.
template <int kThreads, int kMaxK, int kRegs>
__device__ __noinline__ void select_row_radix_call(const float* __restrict__ r, int n, int top_k, const int* __restrict__ bt_row,
                                                   int E, int num_blocks, int physical, int* __restrict__ oi,
                                                   float* __restrict__ os, u64* cand, bool whole_quads) {
    select_row_radix<kThreads, kMaxK, kRegs>(r, n, top_k, bt_row, E, num_blocks, physical, oi, os, cand, whole_quads);
}

// Short rows: the whole exact select of a row in one CTA (select_row.cuh), straight from its
// scores: no histogram, threshold, filter or candidate buffer in global memory, one launch.
// Prefill's thousands of short causal rows go here. kRegs > 0: rows of at most
// kRegs * kThreads entries (ROW_SELECT_MAX_LEN), read once into registers; kRegs = 0: rows
// of any length, read by every pass (the row select forced on long rows, for tests).
// kThreads = 128 (rows of at most 2,048 entries, k <= kMaxK = 1,024 or 512: prefill's causal rows):
// eight CTAs a SM (64 registers, no spills), more rows in flight than the 256-thread form's
// five, half the warps at each of its barriers; a row of at most 1,024 entries takes the
// 8-register form (v36). The 512-slot kernel (prefill-8K's), whose forms share one radix
// fallback reading the row again (select_row.cuh), at twelve (40 registers; spill stores
// of 4 bytes in its 4- and 8-register forms, 12 and 20 in its 12- and 16-register ones, the
// fallback's own only where it runs): -1.4..-1.7 us there against nine, -2.9 us with the
// shared fallback against v60, -1.8 us more with the 12-register form and the 16-register
// one called (v61).
template <int kThreads, int kMaxK, int kRegs>
__global__ void __launch_bounds__(kThreads, kThreads == 128 ? (kMaxK == 512 ? 12 : 8) : 5)  // <= 40, 64, 51 registers
topk_row_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                int top_k, const int* __restrict__ block_table, int L, int E, int num_blocks, int physical,
                int* __restrict__ out_idx, float* __restrict__ out_scores,
                u32* __restrict__ row_ready)  // [rows]: scores stored a row, zero at rest (common.cuh); or null
{
    __shared__ u64 cand[row_cand_slots<kThreads, kMaxK, kRegs>()];
    // rows in reverse: a causal prefill's rows grow with their index, so its longest rows
    // start first and the last wave is of its shortest (the grid's tail less uneven)
    const int row = gridDim.x - 1 - blockIdx.x;
    const int n = visible_len(valid_lens, row, max_len);  // an input: read before any wait
    if (row_ready == nullptr) {
        wait_for_previous_grid();  // the scores come from the kernel before (common.cuh)
    } else {  // the dense kernel's stores of this row counted: it may still run on other SMs
        if (threadIdx.x == 0) {
            wait_for_count(row_ready + row, (u32)n);
            row_ready[row] = 0u;  // at rest again: every add to it is done
        }
        __syncthreads();
    }
    const float* r = scores + (long long)row * ld;
    // every row 16-byte aligned and ld a multiple of 4 (the workspace's rows): 16-byte loads
    const bool whole_quads = (ld & 3) == 0 && (reinterpret_cast<size_t>(scores) & 15u) == 0;
    const int* bt_row = block_table + (long long)row * L;
    int* oi = out_idx + (long long)row * top_k;
    float* os = out_scores ? out_scores + (long long)row * top_k : nullptr;
    if constexpr (kThreads == 128 && kRegs == 16) {
        // a row of at most half the slots (prefill's shorter causal half) by the 8-register
        // form: half the loads and key conversions, half the bins to clear and scan; where
        // the row selects by buckets, one of at most a quarter (prefill's first k rows) by
        // the 4-register form, in 512 buckets, and one of at most three quarters by the
        // 12-register form (2,048 buckets). Each form a function of its own, the 16-register
        // one too where the select is bucketed (inlined together, the registers spill; at
        // twelve CTAs an SM the called 16-register form and the 12-register form each
        // gained ~1 us, v61, where at nine the 12-register form had lost 0.4-1.2 us, v60).
        // Where the select is not bucketed (kQuarter false), the quarter and three-quarter
        // branches name the 8-register form and are never taken.
        constexpr bool kQuarter = kRowSelectBucketed<kThreads, kMaxK, 4>;
        static_assert(row_cand_slots<kThreads, kMaxK, 8>() <= row_cand_slots<kThreads, kMaxK, kRegs>() &&
                      row_cand_slots<kThreads, kMaxK, kQuarter ? 4 : 8>() <= row_cand_slots<kThreads, kMaxK, kRegs>() &&
                      row_cand_slots<kThreads, kMaxK, kQuarter ? 12 : 8>() <= row_cand_slots<kThreads, kMaxK, kRegs>(),
                      "cand");
        if (kQuarter && n <= 4 * kThreads)  // the same form in every thread
            select_row_radix_call<kThreads, kMaxK, kQuarter ? 4 : 8>(r, n, top_k, bt_row, E, num_blocks, physical, oi,
                                                                     os, cand, whole_quads);
        else if (n <= 8 * kThreads)
            select_row_radix_call<kThreads, kMaxK, 8>(r, n, top_k, bt_row, E, num_blocks, physical, oi, os, cand,
                                                      whole_quads);
        else if (kQuarter && n <= 12 * kThreads)
            select_row_radix_call<kThreads, kMaxK, kQuarter ? 12 : 8>(r, n, top_k, bt_row, E, num_blocks, physical, oi,
                                                                      os, cand, whole_quads);
        else if constexpr (kQuarter)
            select_row_radix_call<kThreads, kMaxK, kRegs>(r, n, top_k, bt_row, E, num_blocks, physical, oi, os, cand,
                                                          whole_quads);
        else  // the 1,024-slot kernel's 16-register form inline, as measured (v36-v60)
            select_row_radix<kThreads, kMaxK, kRegs>(r, n, top_k, bt_row, E, num_blocks, physical, oi, os, cand,
                                                     whole_quads);
    } else {
        select_row_radix<kThreads, kMaxK, kRegs>(r, n, top_k, bt_row, E, num_blocks, physical, oi, os, cand,
                                                 whole_quads);
    }
    wait_for_previous_grid();  // never ending before the scoring kernel (a no-op once waited)
}

// The block sort alone: out[0, sort_size(n)) = in[0, n) and zero padding, sorted descending,
// with the final kernel's 1024 threads or the row kernels' 256 or 128 (dynamic shared memory: 8
// bytes per key). For the tests, which check it against NumPy.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) block_sort_kernel(const u64* __restrict__ in, int n, u64* __restrict__ out)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    u64* a = reinterpret_cast<u64*>(smem_raw);
    const u32 size = sort_size((u32)n);
    for (u32 i = threadIdx.x; i < size; i += kThreads) a[i] = i < (u32)n ? in[i] : 0ull;
    __syncthreads();
    bitonic_sort_desc<kThreads>(a, size);
    for (u32 i = threadIdx.x; i < size; i += kThreads) out[i] = a[i];
}
