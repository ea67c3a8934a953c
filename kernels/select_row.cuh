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

// Returns the key of entry i of the row (0 for NaN).
__device__ __forceinline__ u32 row_key(const float* __restrict__ row, int i) { return score_to_key(row[i]); }

// The m winners cand[0, m) (any order; distinct, none zero) put in order, by (score
// descending, index ascending), in place without a sort. Each winner's bucket is the top
// bits of its key's distance below the largest key, on keys whose interval (-eps, eps) is
// collapsed to one point, eps the winners' largest magnitude times 2^-16: a monotone map,
// so larger scores take lower buckets and equal ones the same. Key bits space the buckets
// by binades, as a row's scores spread; the collapse keeps the ~250 binades of tiny
// magnitudes, which winners of both signs span, from crowding the rest into a few buckets
// (without it 48% of prefill-8K's rows fell back to the sort; with it none). A winner's
// slot is its bucket's offset (a block scan of the bucket counts) plus the members of its
// bucket ahead of it, compared as candidates, so it is exact and deterministic whatever
// order the atomics placed them in. The caller then stores the winners from cand in slot
// order. Returns false, having left cand as it was, when a bucket holds more than
// kMaxBucket winners (a plateau of equal scores, or winners crowded by an outlier or
// inside (-eps, eps)): the caller sorts instead.
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
    // the collapse: keys in (key(-eps), key(eps)) map to key(-eps) + 1, keys above shift down
    // to follow it (u32 wrap-around: a gap of 0 or 1 shifts up by 2 or 1; +inf's key has room)
    const float mag = fmaxf(fabsf(key_to_score(hi)), fabsf(key_to_score(lo)));
    const float eps = mag * (1.0f / 65536.0f);  // exact: a power of two
    const u32 kn = score_to_key(-eps), kp = score_to_key(eps), gap = kp - kn - 2u;
    auto collapsed = [&](u32 key) { return key <= kn ? key : key < kp ? kn + 1u : key - gap; };
    const u32 top = collapsed(hi), range = top - collapsed(lo);  // m >= 1: lo <= hi
    const int bits = range ? 32 - __clz((int)range) : 0;
    const int shift = bits > kBucketBits ? bits - kBucketBits : 0;  // range >> shift < kBuckets
    u32 bucket[kPer], slot[kPer];
    // below, groups j * kThreads past m are skipped whole (the same j in every thread): k =
    // 512 in a kernel of kMaxK = 1,024 takes half of them
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        if ((u32)(j * kThreads) >= m) break;
        if ((u32)(tid + j * kThreads) < m) {
            bucket[j] = (top - collapsed(candidate_key(c[j]))) >> shift;
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

// The whole select for one row, run by one CTA of kThreads threads; `cand` is kMaxK u64 of
// shared memory. Also the fallback of select_fast.cu when a row's candidates overflow.
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
                   u64* cand)
{
    static_assert((kMaxK & (kMaxK - 1)) == 0, "kMaxK must be a power of two");
    static_assert(kThreads >= 32 && (kThreads >= 256 || 256 % kThreads == 0), "whole warps; bins split evenly");
    constexpr int kBinsPer = kThreads >= 256 ? 1 : 256 / kThreads;  // histogram bins a thread scans
    __shared__ u32 hist[257];  // 256 digits and a discard bin
    __shared__ u32 scratch[32];
    __shared__ u32 s_bin, s_above, s_whole, s_taken;
    const int tid = threadIdx.x;
    u32 reg_keys[kRegs > 0 ? kRegs : 1];
    if constexpr (kRegs > 0) {
        float v[kRegs];
#pragma unroll
        for (int j = 0; j < kRegs; ++j) v[j] = r[max(min(tid + j * kThreads, n - 1), 0)];
#pragma unroll
        for (int j = 0; j < kRegs; ++j) reg_keys[j] = tid + j * kThreads < n ? score_to_key(v[j]) : 0u;
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
            for (int j = 0; j < kRegs; ++j) gather(j * kThreads + tid, reg_keys[j]);  // keys past n are 0
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
#pragma unroll
            for (int j = 0; j < kRegs; ++j) {
                if (j * kThreads >= n) break;  // the same j in every thread
                collect(j * kThreads + tid, reg_keys[j]);
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
