// select_row.cuh: exact top-k of one float32 score row by radix select, in one CTA.
//
// The fallback of select_fast.cu for rows whose candidates overflow its buffer. The row's
// scores become order-preserving u32 keys (NaN -> 0, never selected). Up to four 8-bit
// histogram passes, most significant digit first, narrow down the key of the k-th best
// entry; they stop as soon as the bin holding it is needed whole (usually after three on
// random rows): then exactly the winners have keys at or above that bin's lower edge, and
// one collection pass gathers them in any order (warp-aggregated slots), since they are
// put in order by (score descending, index ascending) afterwards anyway: by buckets of
// their keys in the short-row kernels (order_winners_bucketed), else, or where a bucket
// is crowded, by a bitonic sort. Only when the
// k-th key itself ties with entries that are not taken (a plateau) does the collection run
// in index order (a block scan per group), taking the lowest-indexed equal entries. No
// locks, no divergent barriers: every loop that contains a barrier has the same trip count
// in every thread.
#pragma once
#include "common.cuh"

// Returns the key of entry i of the row (0 for NaN). An L2 load, as load_row_keys's: the
// short-row kernels' fallback reads rows the dense kernel may have stored while it runs.
__device__ __forceinline__ u32 row_key(const float* __restrict__ row, int i) { return score_to_key(__ldcg(row + i)); }

// The row kernels' keys in registers (kRegs a thread): register j of thread tid holds entry
// row_entry(j, tid), four consecutive entries to a group of four registers (one 16-byte
// load), the groups 4 x kThreads entries apart.
template <int kThreads>
__device__ __forceinline__ int row_entry(int j, int tid) { return (j >> 2) * (4 * kThreads) + 4 * tid + (j & 3); }

// score_to_key with the sign folded in by a mask (no select between ~u and u | 2^31); 0 for
// NaN and where !live
__device__ __forceinline__ u32 live_key(float x, bool live) {
    if (!live || x != x) return 0u;
    const u32 u = __float_as_uint(x + 0.0f);  // -0 -> +0
    return u ^ ((u32)((int)u >> 31) | 0x80000000u);
}

// Entries [0, n) of row r as keys in row_entry's order (0 past n): 16-byte loads where
// `whole_quads` (the caller's rows are 16-byte aligned and their stride ld a multiple of 4
// entries, as the workspace's are), else one entry a load. A 16-byte load starts below n
// (n <= ld) at a multiple of 4, so with ld a multiple of 4 it ends inside the row's ld
// entries: nothing past the row is read.
// L2 loads (ld.global.cg), not the read-only path: the row kernel may read rows the
// dense kernel has just stored while it still runs (common.cuh: row_ready).
template <int kThreads, int kRegs>
__device__ __forceinline__ void load_row_keys(const float* __restrict__ r, int n, bool whole_quads,
                                              u32 (&keys)[kRegs]) {
    static_assert(kRegs % 4 == 0, "whole groups of four");
    const int tid = threadIdx.x;
    float v[kRegs];
    if (whole_quads) {  // the same in every thread
#pragma unroll
        for (int g = 0; g < kRegs / 4; ++g) {
            const int first = row_entry<kThreads>(4 * g, tid);
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (first < n) x = __ldcg(reinterpret_cast<const float4*>(r + first));
            v[4 * g] = x.x;
            v[4 * g + 1] = x.y;
            v[4 * g + 2] = x.z;
            v[4 * g + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < kRegs; ++j) {
            const int i = row_entry<kThreads>(j, tid);
            v[j] = i < n ? __ldcg(r + i) : 0.0f;
        }
    }
#pragma unroll
    for (int g = 0; g < kRegs / 4; ++g) {
        const int left = n - row_entry<kThreads>(4 * g, tid);  // the group's entries below n
#pragma unroll
        for (int e = 0; e < 4; ++e) keys[4 * g + e] = live_key(v[4 * g + e], e < left);
    }
}

// Buckets of keys: the top kBucketBits bits of a key's distance below the largest key hi,
// on keys whose interval [key(-eps), key(eps)] is collapsed to one point, eps the larger
// magnitude of hi's and lo's scores times 2^-16. A monotone map, so larger keys take lower
// buckets and equal keys the same one (which keys share a bucket only decides how much
// comparing is left to the ranking, never the result). Key bits space the buckets by
// binades, as a row's scores spread; the collapse keeps the ~250 binades of tiny
// magnitudes, which keys of both signs span, from crowding the rest into a few buckets
// (without it 48% of prefill-8K's rows crowded a bucket past 32 winners; with it none).
// The collapse is key - clamp(key, key(-eps), key(eps)): read as a signed number it runs
// from -key(-eps) through 0 to 2^32 - 1 - key(eps) (key(-eps) <= 2^31 <= key(eps)), so a
// bucket is two min/max, one three-way add and a shift.
template <int kBucketBits>
struct KeyBuckets {
    u32 edge_lo, edge_hi, top;
    int shift;
    // hi >= lo, both selectable (non-zero) keys
    __device__ __forceinline__ KeyBuckets(u32 hi, u32 lo) {
        const float mag = fmaxf(fabsf(key_to_score(hi)), fabsf(key_to_score(lo)));
        const float eps = mag * (1.0f / 65536.0f);  // exact: a power of two
        edge_lo = score_to_key(-eps);
        edge_hi = score_to_key(eps);
        top = collapsed(hi);
        const u32 range = top - collapsed(lo);  // the distance, in u32 without wrap-around
        const int bits = range ? 32 - __clz((int)range) : 0;
        shift = bits > kBucketBits ? bits - kBucketBits : 0;  // range >> shift < 2^kBucketBits
    }
    __device__ __forceinline__ u32 clamped(u32 key) const { return min(max(key, edge_lo), edge_hi); }
    __device__ __forceinline__ u32 collapsed(u32 key) const { return key - clamped(key); }
    __device__ __forceinline__ u32 operator()(u32 key) const { return (top - key + clamped(key)) >> shift; }
    // The least key of buckets 0..b, at least 1: of the keys between the constructor's lo
    // and hi, those >= it are exactly those of buckets 0..b (the map is monotone), and a
    // zero key (NaN, past the row) never is. From the bucket's bound on the collapsed key
    // (read as signed: top - collapsed(key) < (b + 1) << shift) and the collapse's inverse.
    __device__ __forceinline__ u32 least_key_up_to(u32 b) const {
        const long long c = (long long)(int)top - ((long long)(b + 1u) << shift) + 1;  // least collapsed value
        const long long k = c > 0 ? (long long)edge_hi + c : max((long long)edge_lo + c, 0ll);
        return (u32)max(min(k, 0xffffffffll), 1ll);
    }
};

// The m winners cand[0, m) (any order; distinct, none zero) put in order, by (score
// descending, index ascending), in place without a sort: each winner in its KeyBuckets
// bucket over the winners' own range, its slot its bucket's offset (a block scan of the
// bucket counts) plus the members of its bucket ahead of it, compared as candidates, so it
// is exact and deterministic whatever order the atomics placed them in. The caller then
// stores the winners from cand in slot order. Returns false, having left cand as it was,
// when a bucket holds more than kMaxBucket winners (a plateau of equal scores, or winners
// crowded by an outlier or inside (-eps, eps)): the caller sorts instead.
template <int kThreads, int kMaxK>
__device__ __forceinline__ bool order_winners_bucketed(u64* cand, u32 m, u32* scratch) {
    constexpr int kPer = kMaxK / kThreads;  // winners a thread at most
    constexpr int kBuckets = kMaxK / 2 > 512 ? kMaxK / 2 : 512;  // >= 1 a winner for k up to kMaxK / 2 or 512
    constexpr int kBucketBits = kBuckets >= 2048 ? 11 : kBuckets >= 1024 ? 10 : kBuckets >= 512 ? 9 : 8;  // log2
    constexpr int kBinsPer = kBuckets / kThreads;
    constexpr int kWarps = kThreads / 32;
    constexpr u32 kMaxBucket = 32;
    static_assert(kBinsPer >= 1 && kBuckets % kThreads == 0 && (1 << kBucketBits) == kBuckets, "buckets per thread");
    __shared__ u32 start[kBuckets + 1];  // counts, then offsets (start[kBuckets] = m)
    __shared__ u32 s_lo[kWarps], s_hi[kWarps], s_big;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u64 c[kPer];
    u32 lo = 0xffffffffu, hi = 0u;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const u32 i = (u32)(tid + j * kThreads);
        c[j] = i < m ? cand[i] : 0ull;
        if (i < m) {
            lo = min(lo, candidate_key(c[j]));
            hi = max(hi, candidate_key(c[j]));
        }
    }
    lo = __reduce_min_sync(FULL_MASK, lo);
    hi = __reduce_max_sync(FULL_MASK, hi);
    if (lane == 0) {
        s_lo[warp] = lo;
        s_hi[warp] = hi;
    }
    for (int b = tid; b < kBuckets; b += kThreads) start[b] = 0u;
    if (tid == 0) s_big = 0u;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {  // every thread: the block's smallest and largest key
        lo = min(lo, s_lo[w]);
        hi = max(hi, s_hi[w]);
    }
    const KeyBuckets<kBucketBits> bucket_of(hi, lo);  // m >= 1: lo <= hi
    u32 bucket[kPer], slot[kPer];
    // below, groups j * kThreads past m are skipped whole (the same j in every thread): k =
    // 512 in a kernel of kMaxK = 1,024 takes half of them
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        if ((u32)(j * kThreads) >= m) break;
        if ((u32)(tid + j * kThreads) < m) {
            bucket[j] = bucket_of(candidate_key(c[j]));
            slot[j] = atomicAdd(&start[bucket[j]], 1u);
        }
    }
    __syncthreads();
    u32 cnt[kBinsPer], mine = 0u, big = 0u;
#pragma unroll
    for (int i = 0; i < kBinsPer; ++i) {
        cnt[i] = start[tid * kBinsPer + i];
        mine += cnt[i];
        big = max(big, cnt[i]);
    }
    big = __reduce_max_sync(FULL_MASK, big);
    if (lane == 0) atomicMax(&s_big, big);
    u32 total;
    u32 base = block_exclusive_scan<kThreads>(mine, scratch, &total);  // its barriers: every count read
#pragma unroll
    for (int i = 0; i < kBinsPer; ++i) {
        start[tid * kBinsPer + i] = base;
        base += cnt[i];
    }
    if (tid == 0) start[kBuckets] = total;
    __syncthreads();
    if (s_big > kMaxBucket) return false;  // the same in every thread; cand untouched
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        if ((u32)(j * kThreads) >= m) break;
        if ((u32)(tid + j * kThreads) < m) cand[start[bucket[j]] + slot[j]] = c[j];
    }
    __syncthreads();
    u32 final_slot[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        if ((u32)(j * kThreads) >= m) break;
        if ((u32)(tid + j * kThreads) < m) {
            const u32 first = start[bucket[j]], end = start[bucket[j] + 1];
            u32 ahead = 0u;
            if (end - first > 1u) {  // most buckets hold one winner: its slot is the bucket's
#pragma unroll 1
                for (u32 p = first; p < end; ++p) ahead += cand[p] > c[j] ? 1u : 0u;
            }
            final_slot[j] = first + ahead;
        }
    }
    __syncthreads();  // every bucket read: cand rewritten in order, for the caller's coalesced stores
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        if ((u32)(j * kThreads) >= m) break;
        if ((u32)(tid + j * kThreads) < m) cand[final_slot[j]] = c[j];
    }
    __syncthreads();
    return true;
}

// The short-row kernels of up to 4 winners a thread (keys in registers) select by buckets
// first: ~one bucket a row entry, kRegs * kThreads entries rounded up to a power of two of
// buckets, 512 to 2,048. (At 8 winners a thread, the 1,024-slot kernel, the gathered
// entries' registers spill: 48 bytes.)
template <int kThreads, int kRegs>
__host__ __device__ constexpr int row_buckets() {
    int b = 512;
    while (b < kRegs * kThreads) b *= 2;
    return b;
}
// select_row_bucketed's bucket counts, one array for every form of a kernel: a static
// __shared__ array declared in a function is one per template instance, and a kernel
// calling several forms (each its own function) would hold them all (four forms of
// topk_row_kernel<128, 512, 16> held 34 KB a CTA: six CTAs an SM where eight fit).
constexpr int kRowBinsMax = 2048 + 1 + 32;  // 2,048 buckets, a discard bin, a warp's discard counters
__shared__ __align__(16) u32 row_bins[kRowBinsMax];
template <int kThreads, int kMaxK, int kRegs>
constexpr bool kRowSelectBucketed = kRegs > 0 && kMaxK / kThreads <= 4 && kRegs % 4 == 0 &&
                                    row_buckets<kThreads, kRegs>() <= 2048 &&
                                    row_buckets<kThreads, kRegs>() / kThreads % 4 == 0;
// the most entries of one bucket the bucketed select and order rank by comparison
constexpr u32 kRowBucketMax = 32;
// slots of the candidate buffer a row select needs: kMaxK, and for the bucketed select the
// k-th key's bucket gathered whole (at most kRowBucketMax - 1 past k)
template <int kThreads, int kMaxK, int kRegs>
__host__ __device__ constexpr int row_cand_slots() { return kMaxK + (kRowSelectBucketed<kThreads, kMaxK, kRegs> ? (int)kRowBucketMax : 0); }

// The whole select of a short row whose keys sit in registers (keys past the row and NaN's
// are 0), by buckets instead of radix passes: the row's KeyBuckets, ~one entry a bucket;
// one histogram of the row's keys and a block scan of it give each bucket's offset and the
// bucket of the k-th key; the entries of the buckets up to it are gathered in bucket order
// (cand), each then ranked within its bucket by comparison (exact, ties by index) and
// written to its final slot. One pass over the keys where the radix select takes three or
// four, and no separate ordering. Returns false, having changed nothing but its own
// shared memory, where a bucket up to the k-th key's holds more than kRowBucketMax entries
// (a plateau, or a row crowded by an outlier; found from the counts, before any gather):
// the caller runs the radix select instead.
// On true the row's output is written: each winner stored at its slot straight from the
// thread that ranked it (a warp's slots are its bucket-ordered positions, permuted only
// within crowded buckets: stores about as coalesced as slot order's, without a pass
// through shared memory and a barrier), and the slots past the winners padded.
// Five barriers a row. A gathered candidate carries its bucket in the low word, between the
// key and the index: (key << 32) | (~bucket << kBucketBits) | ~entry, both fields
// kBucketBits wide (kBuckets >= kRegs x kThreads, the row's entries). The bucket falls as
// the key rises, so for candidates of equal keys it is equal and their order is the
// index's, and the candidates order as make_candidate's do.
template <int kThreads, int kMaxK, int kRegs>
__device__ __forceinline__ bool select_row_bucketed(const u32 (&reg_keys)[kRegs], int top_k, u64* cand, u32* scratch,
                                                    const int* __restrict__ bt_row, int E, int num_blocks,
                                                    int physical, int* __restrict__ out_idx,
                                                    float* __restrict__ out_scores) {
    constexpr int kBuckets = row_buckets<kThreads, kRegs>();  // >= the row's entries
    constexpr int kBucketBits = kBuckets == 2048 ? 11 : kBuckets == 1024 ? 10 : 9;
    constexpr u32 kFieldMask = (u32)kBuckets - 1u, kLowMask = (1u << (2 * kBucketBits)) - 1u;
    constexpr int kBinsPer = kBuckets / kThreads;  // a thread's bins in the offsets pass
    constexpr int kQuads = kBinsPer / 4;  // ... four at a time
    constexpr int kWarps = kThreads / 32;
    constexpr int kSlots = (kMaxK + (int)kRowBucketMax + kThreads - 1) / kThreads;  // gathered entries a thread
    static_assert(kRowSelectBucketed<kThreads, kMaxK, kRegs> && (1 << kBucketBits) == kBuckets, "bucket geometry");
    // counts, then offsets, then ends; past them the discard counters: bins[kBuckets] the
    // histogram's (zero keys), bins[kBuckets + 1 + lane] the gather's (entries not taken).
    // Shared atomics under a condition compile to a branch around each (ptxas): these take
    // every lane's atomic unconditionally instead. Never read, never cleared.
    static_assert(kBuckets + 1 + 32 <= kRowBinsMax, "row_bins");
    u32* bins = row_bins;  // [kBuckets + 1 + 32]
    __shared__ u32 s_lo[kWarps], s_hi[kWarps], s_thr, s_end, s_crowded;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint4* quads = reinterpret_cast<uint4*>(bins);

    // ---- the row's largest and smallest selectable keys (the smallest less one, so that a
    // key of 0 wraps past every other without a branch); the bins zeroed
    u32 lo1 = 0xffffffffu, hi = 0u;
#pragma unroll
    for (int j = 0; j < kRegs; ++j) {
        lo1 = min(lo1, reg_keys[j] - 1u);
        hi = max(hi, reg_keys[j]);
    }
    lo1 = __reduce_min_sync(FULL_MASK, lo1);
    hi = __reduce_max_sync(FULL_MASK, hi);
    if (lane == 0) {
        s_lo[warp] = lo1;
        s_hi[warp] = hi;
    }
    for (int i = tid; i < kBuckets / 4; i += kThreads) quads[i] = make_uint4(0u, 0u, 0u, 0u);
    if (tid == 0) s_crowded = 0xffffffffu;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        lo1 = min(lo1, s_lo[w]);
        hi = max(hi, s_hi[w]);
    }
    if (hi == 0u) {  // nothing selectable (the same in every thread): all padding
        for (int i = tid; i < top_k; i += kThreads)
            write_slot(i, 0ull, false, bt_row, E, num_blocks, physical, out_idx, out_scores);
        return true;
    }
    const KeyBuckets<kBucketBits> bucket_of(hi, lo1 + 1u);

    // ---- histogram
#pragma unroll
    for (int j = 0; j < kRegs; ++j) atomicAdd(&bins[reg_keys[j] ? bucket_of(reg_keys[j]) : (u32)kBuckets], 1u);
    __syncthreads();

    // ---- offsets: thread t scans bins [kBinsPer t, kBinsPer (t + 1)), in bucket order (largest
    // keys first); the k-th key's bucket thr is the one with offset < m <= offset + count.
    // Its kQuads 16-byte quads are read starting from quad rot and wrapping around: the
    // quarter-warp's eight loads then fall on eight distinct 16-byte bank groups (in plain
    // order, threads kQuads * 16 bytes apart, two to eight of them shared one: v52).
    // The least crowded bucket (more than kRowBucketMax entries) goes to s_crowded.
    static_assert(8 % kQuads == 0, "a quarter-warp's rotations");
    const u32 rot = ((u32)tid / (8u / kQuads)) % kQuads;
    u32 mine = 0u, before_rot = 0u, most = 0u;  // all my buckets' counts; those of quads before rot; the largest
#pragma unroll
    for (int i = 0; i < kQuads; ++i) {
        const u32 q = ((u32)i + rot) % kQuads;
        const uint4 v = quads[tid * kQuads + q];
        const u32 sum = v.x + v.y + v.z + v.w;
        mine += sum;
        before_rot += q < rot ? sum : 0u;
        most = max(most, max(max(v.x, v.y), max(v.z, v.w)));
    }
    if (most > kRowBucketMax) {  // rare: my first crowded bucket (my bins, not yet rewritten)
        for (int b = 0; b < kBinsPer; ++b) {
            if (bins[tid * kBinsPer + b] > kRowBucketMax) {
                atomicMin(&s_crowded, (u32)(tid * kBinsPer + b));
                break;
            }
        }
    }
    u32 total;
    const u32 base = block_exclusive_scan_one_barrier<kThreads>(mine, scratch, &total);
    const u32 m = min((u32)top_k, total);  // total >= 1: hi is a selectable key
    const u32 kth = m - 1u;  // the k-th key's place: its bucket's offset <= kth < offset + count
    // Only the buckets up to thr's are read after this pass (the gather takes no key past
    // it; the ranking reads its winners' buckets' bounds): a thread whose first bucket starts
    // past the k-th key's place holds none of them and leaves its bins as they are. Its
    // buckets lie past the winners', so most warps skip the pass whole (the winners fill the
    // first ~10-25% of the buckets).
    if (base <= kth) {
        u32 run = base + before_rot;  // quad rot's offset
#pragma unroll
        for (int i = 0; i < kQuads; ++i) {
            const u32 q = ((u32)i + rot) % kQuads;
            if (i > 0 && q == 0u) run = base;  // wrapped around to the first quad
            const uint4 v = quads[tid * kQuads + q];
            const u32 cnt[4] = {v.x, v.y, v.z, v.w};
            u32 off[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                off[e] = run;
                if (kth - run < cnt[e]) {  // exactly one bucket of the row (u32: run > kth wraps)
                    s_thr = (u32)(tid * kBinsPer + e) + 4u * q;
                    s_end = run + cnt[e];
                }
                run += cnt[e];
            }
            quads[tid * kQuads + q] = make_uint4(off[0], off[1], off[2], off[3]);
        }
    }
    __syncthreads();
    const u32 thr = s_thr, end = s_end;
    // a crowded bucket up to thr's (the same in every thread): then thr's may also hold
    // more than cand has room for past the buckets before it (at most m <= kMaxK entries)
    if (s_crowded <= thr) return false;

    // ---- gather the buckets up to thr, each entry at its bucket's next slot: afterwards
    // bins[b] is bucket b's end, and bucket b starts at bins[b - 1] (0 for b = 0)
    // (one compare a key against the least key of buckets up to thr)
    // The map copied through an empty asm: the compiler cannot reuse the histogram's buckets
    // then (16 more live registers through the offsets pass: spills), it makes them again.
    const u32 least = bucket_of.least_key_up_to(thr);
    KeyBuckets<kBucketBits> gather_of = bucket_of;
    asm volatile("" : "+r"(gather_of.edge_lo), "+r"(gather_of.edge_hi), "+r"(gather_of.top), "+r"(gather_of.shift));
#pragma unroll
    for (int j = 0; j < kRegs; ++j) {
        const u32 key = reg_keys[j], b = gather_of(key);
        const bool take = key >= least;
        const u32 slot = atomicAdd(&bins[take ? b : (u32)(kBuckets + 1 + lane)], 1u);
        const u32 low = ((b << kBucketBits) | (u32)row_entry<kThreads>(j, tid)) ^ kLowMask;  // ~b, ~entry
        store_shared_if(cand + slot, ((u64)key << 32) | low, take);
    }
    __syncthreads();

    // ---- rank within the bucket: consecutive slots to consecutive threads, so a warp's
    // lanes share buckets and their compare loops' lengths; each winner stored at once
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
        if ((u32)(j * kThreads) >= end) break;  // the same j in every thread
        const u32 p = (u32)(tid + j * kThreads);
        if (p < end) {
            const u64 c = cand[p];
            const u32 low = (u32)c, b = ~(low >> kBucketBits) & kFieldMask;
            const u32 first = b ? bins[b - 1] : 0u, last = bins[b];
            u32 ahead = 0u;
            if (last - first > 1u) {  // most buckets hold one winner: its slot is the bucket's
                u32 q = first;
#pragma unroll 1
                for (; q + 1u < last; q += 2u) ahead += (cand[q] > c ? 1u : 0u) + (cand[q + 1u] > c ? 1u : 0u);
                if (q < last) ahead += cand[q] > c ? 1u : 0u;
            }
            const u32 slot = first + ahead;
            if (slot < m)
                write_slot((int)slot, make_candidate((u32)(c >> 32), (int)(~low & kFieldMask)), true, bt_row, E,
                           num_blocks, physical, out_idx, out_scores);
        }
    }
    for (int i = (int)m + tid; i < top_k; i += kThreads)
        write_slot(i, 0ull, false, bt_row, E, num_blocks, physical, out_idx, out_scores);
    return true;
}

template <int kThreads, int kMaxK>
__device__ __noinline__ void select_row_radix_reread(const float* __restrict__ r, int n, int top_k,
                                                     const int* __restrict__ bt_row, int E, int num_blocks,
                                                     int physical, int* __restrict__ out_idx,
                                                     float* __restrict__ out_scores, u64* cand);

// The whole select for one row, run by one CTA of kThreads threads; `cand` is
// row_cand_slots<kThreads, kMaxK, kRegs>() u64 of shared memory. Also the fallback of
// select_fast.cu when a row's candidates overflow.
// kRegs > 0: the row has at most kRegs * kThreads entries, read once into registers (all
// loads in flight together) for the five passes; kRegs = 0: each pass reads the row again.
template <int kThreads, int kMaxK, int kRegs = 0>
__device__ __forceinline__ void select_row_radix(
                   const float* __restrict__ r,         // the row's scores
                   int n,                               // entries 0..n-1 are scored (already clamped)
                   int top_k,
                   const int* __restrict__ bt_row,      // the row's block table; only read when physical
                   int E, int num_blocks, int physical,
                   int* __restrict__ out_idx,           // [top_k]
                   float* __restrict__ out_scores,      // [top_k] or nullptr
                   u64* cand,
                   bool whole_quads = false)            // kRegs > 0: load_row_keys may read by 16 bytes
{
    static_assert((kMaxK & (kMaxK - 1)) == 0, "kMaxK must be a power of two");
    static_assert(kThreads >= 32 && (kThreads >= 256 || 256 % kThreads == 0), "whole warps; bins split evenly");
    constexpr int kBinsPer = kThreads >= 256 ? 1 : 256 / kThreads;  // histogram bins a thread scans
    __shared__ u32 hist[257];  // 256 digits and a discard bin
    __shared__ u32 scratch[32];
    __shared__ u32 s_bin, s_above, s_whole, s_taken;
    const int tid = threadIdx.x;
    u32 reg_keys[kRegs > 0 ? kRegs : 1];
    if constexpr (kRegs > 0) load_row_keys<kThreads, kRegs>(r, n, whole_quads, reg_keys);
    if constexpr (kRowSelectBucketed<kThreads, kMaxK, kRegs>) {  // the short rows: buckets first
        // the rare fallback (a crowded bucket) reads the row again, by one function shared by
        // every form: the keys' registers are free once gathered, and the forms' code keeps
        // to their hot path (each form's own radix passes and sort were ~10,000 instructions)
        if (!select_row_bucketed<kThreads, kMaxK, kRegs>(reg_keys, top_k, cand, scratch, bt_row, E, num_blocks,
                                                         physical, out_idx, out_scores))  // the same in every thread
            select_row_radix_reread<kThreads, kMaxK>(r, n, top_k, bt_row, E, num_blocks, physical, out_idx, out_scores,
                                                     cand);
        return;
    }
    // ---- radix select: find the threshold key `prefix` and how many equal to it to take
    u32 prefix = 0u, mask = 0u;
    u32 k_rem = (u32)top_k;
    // every selectable entry wins (at most k of them): known before any pass when the row
    // has at most k entries (prefill's first k causal rows), else found by the first pass
    bool take_all = n <= top_k;
    bool whole_bin = false;  // the winners are exactly the keys >= prefix
    for (int pass = 0; pass < 4 && !take_all; ++pass) {  // the same trip count in every thread
        const int shift = 24 - 8 * pass;
        for (int b = tid; b < 257; b += kThreads) hist[b] = 0u;
        __syncthreads();
        // a unit increment with its result unused compiles to ATOMS.POPC.INC (as the
        // histogram kernel's and the scoring epilogues' counts, which see plateau rows too);
        // no match_any aggregation (it cost ~18 instructions a key). Keys outside the prefix
        // count into bin 256, never read (no branch per key).
        auto count = [&](u32 key) {
            const bool match = key != 0u && (key & mask) == prefix;
            atomicAdd(&hist[match ? (key >> shift) & 255u : 256u], 1u);
        };
        if constexpr (kRegs > 0) {
#pragma unroll
            for (int j = 0; j < kRegs; ++j) count(reg_keys[j]);  // keys past n are 0: not counted
        } else {
            for (int i = tid; i < n; i += kThreads) count(row_key(r, i));
        }
        __syncthreads();
        // Suffix scan over bins from 255 down: thread j owns bins 255 - kBinsPer * j - i,
        // i < kBinsPer (none past bin 0).
        u32 total, cnt[kBinsPer], mine = 0u;
#pragma unroll
        for (int i = 0; i < kBinsPer; ++i) {
            const int b = 255 - kBinsPer * tid - i;
            cnt[i] = b >= 0 ? hist[b] : 0u;
            mine += cnt[i];
        }
        u32 above = block_exclusive_scan<kThreads>(mine, scratch, &total);
        if (pass == 0 && total <= k_rem) take_all = true;  // same value in every thread
        if (take_all) break;
#pragma unroll
        for (int i = 0; i < kBinsPer; ++i) {
            const int b = 255 - kBinsPer * tid - i;
            if (b >= 0 && above < k_rem && k_rem <= above + cnt[i]) {
                s_bin = (u32)b;
                s_above = above;
                s_whole = (k_rem == above + cnt[i]) ? 1u : 0u;  // the k-th key's bin is taken whole
            }
            above += cnt[i];
        }
        __syncthreads();
        prefix |= s_bin << shift;
        mask |= 255u << shift;
        k_rem -= s_above;
        whole_bin = s_whole != 0u;
        __syncthreads();
        if (whole_bin) break;  // the same in every thread
    }
    // take_all: every selectable entry (key > 0) is a winner; whole_bin: every key >= prefix
    // (the lower edge of the bin reached); else keys > prefix, plus the k_rem lowest-indexed
    // keys == prefix (prefix is then a whole key, after four passes).
    const u32 thr = take_all ? 0u : prefix;
    const u32 take_eq = take_all ? 0u : k_rem;
    u32 gt_base = 0u, eq_base = 0u;

    if (take_all || whole_bin) {
        // ---- collection in any order: the winners are exactly the keys >= thr (at most k)
        if (tid == 0) s_taken = 0u;
        __syncthreads();
        auto gather = [&](int i, u32 key) {
            const bool win = key != 0u && key >= thr;
            const u32 ballot = __ballot_sync(FULL_MASK, win);
            if (ballot) {
                const int lane = tid & 31, leader = __ffs(ballot) - 1;
                u32 base = 0u;
                if (lane == leader) base = atomicAdd(&s_taken, (u32)__popc(ballot));
                base = __shfl_sync(FULL_MASK, base, leader);
                if (win) cand[base + __popc(ballot & ((1u << lane) - 1u))] = make_candidate(key, i);
            }
        };
        if constexpr (kRegs > 0) {
#pragma unroll
            for (int j = 0; j < kRegs; ++j) gather(row_entry<kThreads>(j, tid), reg_keys[j]);  // keys past n are 0
        } else {
            for (int start = 0; start < n; start += kThreads) {
                const int i = start + tid;
                gather(i, i < n ? row_key(r, i) : 0u);
            }
        }
        __syncthreads();
        gt_base = s_taken;
    } else {
        // ---- collection in index order: positions from a block scan, so the result is deterministic
        const u32 n_gt = (u32)top_k - k_rem;  // entries strictly above thr
        auto collect = [&](int i, u32 key) {  // every thread, once per group of kThreads entries
            const u32 gt = key > thr;
            const u32 eq = (key == thr && key != 0u);
            u32 total;
            const u32 pre = block_exclusive_scan<kThreads>((gt << 16) | eq, scratch, &total);
            if (gt) {
                const u32 pos = gt_base + (pre >> 16);
                if (pos < (u32)kMaxK) cand[pos] = make_candidate(key, i);
            } else if (eq) {
                const u32 rank = eq_base + (pre & 0xffffu);
                if (rank < take_eq) cand[n_gt + rank] = make_candidate(key, i);
            }
            gt_base += total >> 16;
            eq_base += total & 0xffffu;
        };
        if constexpr (kRegs > 0) {
            // a group of four registers at a time: each thread's four consecutive entries,
            // the threads' in index order, one block scan of their counts
#pragma unroll
            for (int g = 0; g < kRegs / 4; ++g) {
                if (g * 4 * kThreads >= n) break;  // the same g in every thread
                u32 gt = 0u, eq = 0u;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 key = reg_keys[4 * g + e];
                    gt += key > thr ? 1u : 0u;
                    eq += key == thr && key != 0u ? 1u : 0u;
                }
                u32 total;
                const u32 pre = block_exclusive_scan<kThreads>((gt << 16) | eq, scratch, &total);
                u32 pos = gt_base + (pre >> 16), rank = eq_base + (pre & 0xffffu);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 key = reg_keys[4 * g + e];
                    const int i = row_entry<kThreads>(4 * g + e, tid);
                    if (key > thr) {
                        if (pos < (u32)kMaxK) cand[pos] = make_candidate(key, i);
                        ++pos;
                    } else if (key == thr && key != 0u) {
                        if (rank < take_eq) cand[n_gt + rank] = make_candidate(key, i);
                        ++rank;
                    }
                }
                gt_base += total >> 16;
                eq_base += total & 0xffffu;
            }
        } else {
            for (int start = 0; start < n; start += kThreads) {
                const int i = start + tid;
                collect(i, i < n ? row_key(r, i) : 0u);
            }
        }
    }
    const u32 m_raw = take_all || whole_bin ? gt_base : (u32)top_k;
    const u32 m = m_raw < (u32)top_k ? m_raw : (u32)top_k;

    // ---- the winners in order: by buckets where the row's keys spread them (the row kernels
    // of up to 8 winners a thread), else a bitonic sort, descending by (key, ~index)
    bool sorted = false;
    if constexpr (kRegs > 0 && kMaxK / kThreads <= 8) {
        __syncthreads();  // every winner in cand (the index-ordered collection ends on a store)
        sorted = m > 0u && order_winners_bucketed<kThreads, kMaxK>(cand, m, scratch);  // the same in every thread
    }
    if (!sorted) {
        const u32 size = sort_size(m);  // m <= top_k <= kMaxK; zero keys sort last
        for (u32 i = m + tid; i < size; i += kThreads) cand[i] = 0ull;
        __syncthreads();
        bitonic_sort_desc<kThreads>(cand, size);
    }

    // ---- write indices (logical or physical) and scores; -1 / -inf padding
    for (int i = tid; i < top_k; i += kThreads)
        write_winner(i, m, cand, bt_row, E, num_blocks, physical, out_idx, out_scores);
}

// select_row_radix reading the row at every pass (kRegs = 0), as a function of its own: the
// fallback of the bucketed short-row select, one copy for all of a kernel's forms.
template <int kThreads, int kMaxK>
__device__ __noinline__ void select_row_radix_reread(const float* __restrict__ r, int n, int top_k,
                                                     const int* __restrict__ bt_row, int E, int num_blocks,
                                                     int physical, int* __restrict__ out_idx,
                                                     float* __restrict__ out_scores, u64* cand) {
    select_row_radix<kThreads, kMaxK, 0>(r, n, top_k, bt_row, E, num_blocks, physical, out_idx, out_scores, cand);
}
