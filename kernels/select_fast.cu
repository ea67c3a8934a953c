// select_fast.cu: exact top-k over many CTAs per row, for long rows and large batches.
//
//   1. histogram: count the top 11 bits of every score key of a row (2048 bins); the
//      tensor-core scoring kernel does this in its epilogue, topk_histogram_kernel does it
//      for the FP32 path;
//   2. topk_threshold_kernel: per row, the bin b* holding the k-th best key;
//   3. topk_filter_kernel: every entry whose key is in a bin >= b* becomes a candidate,
//      appended to a bounded per-row buffer of kCap (key, index) pairs; the counter keeps
//      counting past kCap, so an overflow is never silent;
//   4. topk_final_kernel: per row, a bitonic sort of the candidates by (score descending,
//      index ascending) gives the answer. Every entry tying with the k-th best is a
//      candidate, so the tie rule holds exactly. A row whose candidates overflowed the
//      buffer is selected from its full score row by the single-CTA radix select instead.
// Candidate order in the buffer depends on atomics; the sort makes the output deterministic.
#include "common.cuh"
#include "select_row.cuh"

namespace select_fast {
constexpr int kBins = 2048;       // top 11 bits of a key
constexpr int kBinShift = 21;
}  // namespace select_fast

// grid (rows, chunks), kThreads threads, each CTA counts kPerThread * kThreads entries.
template <int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads)
topk_histogram_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                      u32* __restrict__ hist)  // [rows, kBins], zeroed
{
    using namespace select_fast;
    __shared__ u32 h[kBins];
    const int row = blockIdx.x;
    int n = valid_lens[row];
    n = n < 0 ? 0 : (n > max_len ? max_len : n);
    const int start = blockIdx.y * kThreads * kPerThread;
    if (start >= n) return;
    for (int i = threadIdx.x; i < kBins; i += kThreads) h[i] = 0u;
    __syncthreads();
    const float* r = scores + (long long)row * ld;
    for (int j = 0; j < kPerThread; ++j) {
        const int i = start + j * kThreads + threadIdx.x;
        if (i < n) {
            const u32 key = score_to_key(r[i]);
            if (key) atomicAdd(&h[key >> kBinShift], 1u);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kBins; i += kThreads)
        if (h[i]) atomicAdd(&hist[(long long)row * kBins + i], h[i]);
}

// One CTA of 256 threads per row: thr[row] = b*, or 0 when the row has at most k
// selectable entries (then every non-NaN entry is a candidate).
__global__ void __launch_bounds__(256)
topk_threshold_kernel(const u32* __restrict__ hist, int top_k, u32* __restrict__ thr)
{
    using namespace select_fast;
    __shared__ u32 scratch[32];
    constexpr int kPer = kBins / 256;
    const int row = blockIdx.x, tid = threadIdx.x;
    const u32* h = hist + (long long)row * kBins;
    // thread tid owns bins kBins-1-kPer*tid .. down to kBins-kPer*(tid+1): descending order
    u32 mine[kPer];
    u32 sum = 0u;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        mine[j] = h[kBins - 1 - (kPer * tid + j)];
        sum += mine[j];
    }
    u32 total;
    u32 above = block_exclusive_scan<256>(sum, scratch, &total);
    if (total <= (u32)top_k) {
        if (tid == 0) thr[row] = 0u;
        return;
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        if (above < (u32)top_k && (u32)top_k <= above + mine[j]) thr[row] = (u32)(kBins - 1 - (kPer * tid + j));
        above += mine[j];
    }
}

// grid (rows, chunks): append every entry whose key bin is >= thr[row] to the row's buffer.
template <int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads)
topk_filter_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                   const u32* __restrict__ thr, u32* __restrict__ count, u64* __restrict__ cand, int cap)
{
    using namespace select_fast;
    const int row = blockIdx.x;
    int n = valid_lens[row];
    n = n < 0 ? 0 : (n > max_len ? max_len : n);
    const int start = blockIdx.y * kThreads * kPerThread;
    if (start >= n) return;
    const u32 bin = thr[row];
    const float* r = scores + (long long)row * ld;
    u64* out = cand + (long long)row * cap;
    const int lane = threadIdx.x & 31;
    // every load in flight before the first (possibly atomic-bound) append
    u32 keys[kPerThread];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
        const int i = start + j * kThreads + threadIdx.x;
        keys[j] = i < n ? score_to_key(r[i]) : 0u;
    }
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
        const int i = start + j * kThreads + threadIdx.x;
        const u32 key = keys[j];
        const bool take = key != 0u && (key >> kBinShift) >= bin;
        const u32 mask = __ballot_sync(FULL_MASK, take);
        if (mask == 0u) continue;
        u32 base = 0u;
        if (lane == __ffs(mask) - 1) base = atomicAdd(&count[row], (u32)__popc(mask));
        base = __shfl_sync(FULL_MASK, base, __ffs(mask) - 1);
        if (take) {
            const u32 pos = base + (u32)__popc(mask & ((1u << lane) - 1u));
            if (pos < (u32)cap) out[pos] = make_candidate(key, i);
        }
    }
}

// One CTA per row: sort the candidates, or fall back to the full-row radix select.
template <int kThreads, int kCap>
__global__ void __launch_bounds__(kThreads)
topk_final_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                  const u32* __restrict__ count, const u64* __restrict__ cand, int top_k,
                  const int* __restrict__ block_table, int L, int E, int num_blocks, int physical,
                  int* __restrict__ out_idx, float* __restrict__ out_scores)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    u64* buf = reinterpret_cast<u64*>(smem_raw);  // kCap
    const int row = blockIdx.x, tid = threadIdx.x;
    int n = valid_lens[row];
    n = n < 0 ? 0 : (n > max_len ? max_len : n);
    const u32 cnt = n > 0 ? count[row] : 0u;
    const int* bt_row = block_table + (long long)row * L;
    int* oi = out_idx + (long long)row * top_k;
    float* os = out_scores ? out_scores + (long long)row * top_k : nullptr;
    if (cnt > (u32)kCap) {  // the buffer overflowed: exact select over the whole row
        select_row_radix<kThreads, kCap>(scores + (long long)row * ld, n, top_k, bt_row, E, num_blocks, physical,
                                         oi, os, buf);
        return;
    }
    u32 size = 64u;  // bitonic_sort_desc needs at least 64 keys
    while (size < cnt) size <<= 1;
    const u64* src = cand + (long long)row * kCap;
    for (u32 i = tid; i < size; i += kThreads) buf[i] = i < cnt ? src[i] : 0ull;
    __syncthreads();
    bitonic_sort_desc<kThreads>(buf, size);
    const u32 m = cnt < (u32)top_k ? cnt : (u32)top_k;
    for (int i = tid; i < top_k; i += kThreads) write_winner(i, m, buf, bt_row, E, num_blocks, physical, oi, os);
}

// Short rows (at most a few thousand entries): the whole exact select of a row in one CTA
// (select_row.cuh), straight from its scores: no histogram, threshold, filter or candidate
// buffer in global memory, one launch. Prefill's thousands of short causal rows go here.
template <int kThreads, int kMaxK>
__global__ void __launch_bounds__(kThreads)
topk_row_kernel(const float* __restrict__ scores, long long ld, const int* __restrict__ valid_lens, int max_len,
                int top_k, const int* __restrict__ block_table, int L, int E, int num_blocks, int physical,
                int* __restrict__ out_idx, float* __restrict__ out_scores)
{
    __shared__ u64 cand[kMaxK];
    const int row = blockIdx.x;
    int n = valid_lens[row];
    n = n < 0 ? 0 : (n > max_len ? max_len : n);
    select_row_radix<kThreads, kMaxK>(scores + (long long)row * ld, n, top_k, block_table + (long long)row * L, E,
                                      num_blocks, physical, out_idx + (long long)row * top_k,
                                      out_scores ? out_scores + (long long)row * top_k : nullptr, cand);
}
