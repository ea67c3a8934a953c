// ragged.cu: the per-token block table of score_topk_ragged (indexer/ragged.py).
//
// dst[t, :] = table[b(t), :], b(t) the sequence holding query row t: searchsorted(cu, t,
// 'right') - 1 over the B + 1 offsets, clamped to [0, B - 1] exactly as
// ragged.sequence_of_token, so malformed offsets (validation off) never index outside the
// table. One CTA a row: its threads find b(t) (the same binary search each, over offsets
// that stay in L1) and copy the row's L ids. A raw kernel, not a CuPy elementwise one: a
// call launches it every time, and CuPy's elementwise launch costs ~3x a raw launch of host
// time (docs/performance.md v44).
#include "common.cuh"

// grid (T,), any block size
__global__ void expand_block_table_kernel(const int* __restrict__ table,  // [B, L]
                                          const int* __restrict__ cu,     // [B + 1]
                                          int n_seq, int L,
                                          int* __restrict__ dst)          // [T, L]
{
    const long long t = blockIdx.x;
    int lo = 0, hi = n_seq + 1;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if ((long long)cu[mid] <= t) lo = mid + 1; else hi = mid;
    }
    const int last = n_seq - 1 > 0 ? n_seq - 1 : 0;
    const int b = lo - 1 < 0 ? 0 : (lo - 1 > last ? last : lo - 1);
    const int* src = table + (long long)b * L;
    int* out = dst + t * L;
    for (int j = threadIdx.x; j < L; j += blockDim.x) out[j] = src[j];
}
