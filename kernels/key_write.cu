// key_write.cu: KeyPool's writes on the GPU, every block an append touches in one launch.
//
// One CTA per touched block (an "item" of the host's plan, indexer/keywrite.py): rows
// row0 .. row0 + count - 1 of the float32 keys (n, D) go to entries used .. used + count - 1
// of physical block p, under the pool's global-scale rule (indexer/pool.py's docstring):
//   * a block with no entries (used == 0), or whose entries are all zero so far, takes
//     g = pow2(amax of the new rows);
//   * a block whose new rows exceed its capacity 6 * 448 * g grows to g_new = pow2(amax),
//     and its first `used` entries are re-expressed at g_new: each group's scale s becomes
//     s / 2**m where that is an E4M3 value, else the group is re-quantized from its exactly
//     decoded values;
//   * otherwise g stays.
// A fresh block's entries past the new rows are zeroed, as the host pool's padded write
// does. Every rounding is the NumPy form's (indexer/nvfp4.py: IEEE float32 division and
// products, E4M3 and E2M1 nearest-even, saturating), so the bytes equal the host pool's.
// The host has checked the keys (finite, within the largest storable magnitude) and that the
// items' blocks are distinct.
#include "common.cuh"
#include "nvfp4_encode.cuh"

namespace keywrite {

constexpr int kThreads = 128;
constexpr long long kPadSlot = -1;  // a padding key's slot (indexer.keywrite.PAD_SLOT): not written

__device__ __forceinline__ float block_max(float v, float* scratch) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, scratch[w]);
    return m;
}

// Rows `rows` (count of them, D elements each, a key element type of common.cuh) written at
// entries used .. used + count - 1 of block p under the global-scale rule (the file's head).
// Called by every thread of a CTA (it synchronises), one block a CTA.
template <typename KeyT>
__device__ __forceinline__ void write_block(long long p, int used, const KeyT* __restrict__ rows, int count, int D,
                                            int E, u8* __restrict__ codes, u8* __restrict__ scales,
                                            float* __restrict__ gscale) {
    __shared__ float amax_by_warp[kThreads / 32];
    __shared__ int held_by_warp[kThreads / 32];
    __shared__ float decided[2];  // g before, g after
    __shared__ int grows;         // whether the block's entries are re-expressed at the new g
    const int groups = D / kGroup, row_bytes = D / 2;
    u8* block_codes = codes + p * E * row_bytes;
    u8* block_scales = scales + p * E * groups;

    // the new rows' amax, and whether the block holds a nonzero entry (a nonzero scale byte)
    float amax = 0.0f;
    for (long long i = threadIdx.x; i < (long long)count * D; i += kThreads) amax = fmaxf(amax, fabsf(query_float(rows[i])));
    int held = 0;
    for (long long i = threadIdx.x; i < (long long)used * groups; i += kThreads) held |= block_scales[i];
    held = __any_sync(FULL_MASK, held != 0);
    if ((threadIdx.x & 31) == 0) held_by_warp[threadIdx.x >> 5] = held;
    amax = block_max(amax, amax_by_warp);  // synchronises: held_by_warp is written
    if (threadIdx.x == 0) {
        bool any_held = false;
        for (int w = 0; w < kThreads / 32; ++w) any_held |= held_by_warp[w] != 0;
        const float g_old = gscale[p];
        const bool over = (double)amax > (double)kCapacity * (double)g_old;
        // empty or only zeros: those decode to 0 under any g, so g comes from the new rows
        const float g = (!any_held || over) ? pow2_scale(amax) : g_old;
        decided[0] = g_old;
        decided[1] = g;
        grows = any_held && over;
        gscale[p] = g;
    }
    __syncthreads();
    const float g_old = decided[0], g = decided[1];

    // a grown block's entries re-expressed at g = g_old * 2**m
    if (grows) {
        for (long long i = threadIdx.x; i < (long long)used * groups; i += kThreads) {
            const long long entry = i / groups;
            const int group = (int)(i - entry * groups);
            u8* c = block_codes + entry * row_bytes + group * (kGroup / 2);
            block_scales[i] = (u8)rescale_group(block_scales[i], g_old, g, c);
        }
    }

    // the new rows at g
    for (long long i = threadIdx.x; i < (long long)count * groups; i += kThreads) {
        const long long r = i / groups;
        const int group = (int)(i - r * groups);
        const KeyT* x = rows + r * D + group * kGroup;
        float v[kGroup];
#pragma unroll
        for (int j = 0; j < kGroup; ++j) v[j] = query_float(x[j]);
        const long long entry = used + r;
        block_scales[entry * groups + group] =
            (u8)quantize_group(v, g, block_codes + entry * row_bytes + group * (kGroup / 2));
    }

    // a fresh block's entries past the new rows: zero, as the host pool's padded write leaves them
    if (used == 0) {
        for (long long i = (long long)count * row_bytes + threadIdx.x; i < (long long)E * row_bytes; i += kThreads)
            block_codes[i] = 0;
        for (long long i = (long long)count * groups + threadIdx.x; i < (long long)E * groups; i += kThreads)
            block_scales[i] = 0;
    }
}

}  // namespace keywrite

// items: int32 (n_items, 4) = (block p, entries used, first row, row count), distinct blocks
// (KeyPool's plan, indexer/keywrite.py). keys: float32 (n, D), C-contiguous. Pool: codes
// (P, E, D/2), scales (P, E, D/16), gscale (P,).
__global__ void __launch_bounds__(keywrite::kThreads)
key_write_kernel(const int* __restrict__ items, const float* __restrict__ keys, int D, int E,
                 u8* __restrict__ codes, u8* __restrict__ scales, float* __restrict__ gscale)
{
    const int4 item = reinterpret_cast<const int4*>(items)[blockIdx.x];
    keywrite::write_block(item.x, item.y, keys + (long long)item.z * D, item.w, D, E, codes, scales, gscale);
}

// indexer.write_keys: key i (of N, element type KeyT, C-contiguous (N, D)) goes to physical
// slot slots[i] = block * E + entry of a pool of P blocks. A run is a maximal stretch of keys
// whose slots follow one another within one block; the CTA of a run's first key writes the
// run (the others return at once). Runs of distinct blocks write distinct blocks (the host
// checks that with validate=True; without, two runs of one block race, but nothing is read
// or written outside the arrays). A slot outside [0, P * E) is skipped: kPadSlot (-1) marks a
// padding key, any other is bad input the host's check refuses.
template <typename SlotT, typename KeyT>
__global__ void __launch_bounds__(keywrite::kThreads)
key_write_slots_kernel(const SlotT* __restrict__ slots, int N, const KeyT* __restrict__ keys, int D, int E, int P,
                       u8* __restrict__ codes, u8* __restrict__ scales, float* __restrict__ gscale)
{
    using namespace keywrite;
    __shared__ int run;
    const long long i = blockIdx.x, total = (long long)P * E;
    const long long slot = (long long)slots[i];
    if (slot < 0 || slot >= total) return;
    const long long p = slot / E;
    const int entry = (int)(slot - p * E);
    if (i > 0) {
        const long long prev = (long long)slots[i - 1];
        if (prev >= 0 && prev == slot - 1 && prev / E == p) return;  // inside a run (slot - 1: no overflow)
    }
    // the run's length: the first j with slots[i + j] != slot + j, at most to the block's end
    const int most = (int)min((long long)(N - i), (long long)(E - entry));
    if (threadIdx.x == 0) run = most;
    __syncthreads();
    for (int j = 1 + threadIdx.x; j < most; j += kThreads)
        if ((long long)slots[i + j] != slot + j) atomicMin(&run, j);
    __syncthreads();
    write_block(p, entry, keys + i * D, run, D, E, codes, scales, gscale);
}

// indexer.write_keys(validate=True)'s value checks, in one launch whose result is read back
// once (as check_values.cu is for score_topk); KeyPool.append_many's keys check is check 0
// alone (N = 0). found[c] is 0 when check c passed, else ~i for an offending position i
// (atomicMax of ~i keeps the smallest found; ~i is never 0):
//   c = 0: a key element i (of n_values, D a key) that is NaN, infinite or above max_key in
//          magnitude, unless its key is padding;
//   c = 1: a key i whose slot is outside [0, P * E) and not kPadSlot (-1: padding, skipped);
//   c = 2: a key i that starts a run (as key_write_slots_kernel's) of a block another run
//          also starts in: each start claims its block in `table`, an open-addressed set of
//          block + 1 (0 = empty) with 2**log2_places places, more than twice the keys, so
//          a probe always ends (Fibonacci hashing: the product's top bits pick the place);
//   c = 3: a key i that starts a run of a block whose key_gscale is not a power of two in
//          [2**min_exp, 2**max_exp].
// found and table are zero before the launch (one memset). The host words the message from
// the arrays where a check failed (indexer/keywrite.py), so which offender is found first
// does not matter.
template <typename SlotT, typename KeyT>
__global__ void __launch_bounds__(256)
key_check_kernel(const SlotT* __restrict__ slots, int N, const KeyT* __restrict__ keys, long long n_values, int D,
                 int E, int P,
                 const float* __restrict__ gscale, float max_key, int min_exp, int max_exp,
                 u64* __restrict__ found, u64* __restrict__ table, int log2_places)
{
    using namespace keywrite;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long total = (long long)P * E;
    const u64 mask = (1ull << log2_places) - 1;
    for (long long i = first; i < n_values; i += stride)
        if (!(fabsf(query_float(keys[i])) <= max_key)                  // NaN fails too
            && (N == 0 || (long long)slots[i / D] != kPadSlot)) atomicMax(found + 0, ~(u64)i);
    for (long long i = first; i < N; i += stride) {
        const long long slot = (long long)slots[i];
        if (slot == kPadSlot) continue;
        if (slot < 0 || slot >= total) {
            atomicMax(found + 1, ~(u64)i);
            continue;
        }
        const long long p = slot / E;
        if (i > 0) {
            const long long prev = (long long)slots[i - 1];
            if (prev >= 0 && prev == slot - 1 && prev / E == p) continue;  // inside a run (slot - 1: no overflow)
        }
        const u32 bits = __float_as_uint(gscale[p]);
        const int exponent = (int)((bits >> 23) & 0xFFu) - 127;
        if ((bits & 0x807FFFFFu) != 0u || exponent < min_exp || exponent > max_exp) atomicMax(found + 3, ~(u64)i);
        const u64 key = (u64)p + 1;
        for (u64 h = (key * 0x9E3779B97F4A7C15ull) >> (64 - log2_places);; h = (h + 1) & mask) {
            const u64 held = atomicCAS(table + h, 0ull, key);
            if (held == 0ull) break;  // claimed
            if (held == key) {        // claimed before by another run
                atomicMax(found + 2, ~(u64)i);
                break;
            }
        }
    }
}
