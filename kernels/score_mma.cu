// score_mma.cu: the fast scoring path on tensor cores (mma.sync m16n8k16, fp16 in, fp32 out).
//
// Scores as score_fp32.cu does, to the same float32 workspace, with the dot products on
// tensor cores:
//   * A operand = keys, 16 entries x 16 dims per MMA, decoded from NVFP4 straight into the
//     A-fragment registers: no shared-memory round trip. Each thread loads D/8 contiguous
//     bytes of each of its rows; the MMA's K index is a fixed permutation of d chosen so
//     that those bytes are exactly the thread's fragment elements (the query is laid out
//     with the same permutation, so the dot product is unchanged).
//   * Element decode and K permutation: see fast_common.cuh.
//   * B operand = the query: per head, a power of two brings max |q| into [2^14, 2^15)
//     before rounding to fp16 (so the rounding error is 2^-11 relative); 2^8 and that power
//     of two are folded back into the head weight in float32.
//   * Keys stream through KeyRing (fast_common.cuh), so global latency hides behind the
//     tensor work of earlier tiles.
//   * Epilogue: ReLU that keeps NaN (max.NaN), weighted head sum, quad shuffles, the block's
//     global scale; scores written to the workspace, and the top 11 bits of each score's
//     order key counted into a per-row histogram (the first pass of the radix select).
#include "fast_common.cuh"

// Query staging, once per call: prep_query_row (fast_common.cuh) into the rows
// [T][kHeads][D + 8] and weights [T][kHeads] that the mma.sync and single-query wgmma kernels
// read.
template <int kDim, int kNBlocks, class QT = float>
__global__ void __launch_bounds__(256)
prep_query_kernel(const QT* __restrict__ q,  // [T, H, kDim]: float, half_bits, bf16_bits or e4m3_bits
                  const float* __restrict__ w, int H,
                  unsigned short* __restrict__ q16,  // [T, kHeads, kDim + 8]
                  float* __restrict__ w_scaled)      // [T, kHeads]
{
    // the wgmma scoring kernel after this one, launched programmatically in graphs, may be
    // placed now: it schedules its tiles and starts its key copies, then waits for this grid
    // before it copies the staged rows in (score_wgmma.cu)
    let_next_grid_start();
    prep_query_row<kDim, kNBlocks>(q, w, H, PrepToRows<kDim, 8 * kNBlocks>{q16, w_scaled});
}


// The CTA's shared memory, as byte offsets: the staged query rows, the weights, the key
// ring, the histogram. kBytes is what indexer.geometry.score_mma_launch sizes the launch to
// (checked at compile time by scripts/compile_kernels.py).
template <int kDim, int kNBlocks>
struct MmaSmem {
    static constexpr int kHeads = 8 * kNBlocks;
    static constexpr int kQ = 0;                                    // u16 [kHeads][kDim + 8]: conflict-free ldmatrix
    static constexpr int kW = kQ + kHeads * (kDim + 8) * 2;         // float [kHeads]
    static constexpr int kRing = kW + kHeads * 4;                   // KeyRing<kDim>
    static constexpr int kHist = kRing + KeyRing<kDim>::kSmemBytes;  // u32 [kHistBins]
    static constexpr int kBytes = kHist + score_mma::kHistBins * 4;
};

// kDim: head dim (multiple of 32). kNBlocks: 8-head column blocks (even; heads padded).
template <int kDim, int kNBlocks>
__global__ void __launch_bounds__(score_mma::kWarps * 32, 3)  // 3 CTAs per SM: at most 170 registers
score_mma_kernel(const unsigned short* __restrict__ q16,  // [T, kHeads, kDim + 8] from prep_query_kernel
                 const float* __restrict__ w_scaled,      // [T, kHeads]
                 const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                 const u8* __restrict__ key_scale,        // [P, E, D/16]
                 const float* __restrict__ key_gscale,    // [P]
                 const int* __restrict__ block_table,     // [T, L]
                 const int* __restrict__ valid_lens,      // [T]
                 int P, int E, int e_shift,               // e_shift = log2(E) when E is a power of two, else -1
                 int L, int tiles_per_cta,
                 float* __restrict__ scores,              // [T, ld] workspace
                 long long ld,
                 u32* __restrict__ hist,                  // [T, kHistBins] or nullptr
                 u32* __restrict__ count)                 // [T] candidate counts, cleared here, or nullptr
{
    clear_candidate_counts(count, gridDim.x);  // grid (T, chunks)
    using namespace score_mma;
    using Ring = KeyRing<kDim>;
    static_assert(kDim % 32 == 0 && kDim >= 32 && kDim <= 256, "D must be a multiple of 32 in [32, 256]");
    static_assert(kNBlocks % 2 == 0 && kNBlocks >= 2 && kNBlocks <= 16, "heads padded to 16..128");
    constexpr int kHeads = 8 * kNBlocks;
    constexpr int kWords = kDim / 32;          // 32-bit words of codes per thread and row
    constexpr int kRowHalves = kDim + 8;       // padded smem row of the query: conflict-free ldmatrix
    constexpr int kThreads = kWarps * 32;
    constexpr int kQBytes = kHeads * kRowHalves * 2;
    static_assert(kThreads == kTileEntries, "one thread per entry of a tile for the metadata");
    static_assert(kQBytes % 16 == 0, "query rows copy in 16-byte chunks");

    using Smem = MmaSmem<kDim, kNBlocks>;
    static_assert(Smem::kW - Smem::kQ == kQBytes, "the query rows' layout");
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned short* qs = reinterpret_cast<unsigned short*>(smem + Smem::kQ);  // [kHeads][kRowHalves]
    float* wsm = reinterpret_cast<float*>(smem + Smem::kW);                  // [kHeads]
    unsigned char* ring_smem = smem + Smem::kRing;
    u32* hist_s = reinterpret_cast<u32*>(smem + Smem::kHist);                // [kHistBins]

    const int t = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    Ring keys;
    if (!keys.init(ring_smem, keys_fp4, key_scale, key_gscale, block_table, valid_lens, t, P, E, e_shift, L,
                   tiles_per_cta))
        return;  // uniform: this CTA's tiles lie past the row's end
    const int n = keys.n, first_tile = keys.first_tile, num_tiles = keys.num_tiles;

    // ---- prologue: query and weights (first copy group), metadata and copies of the first stages
    {
        const unsigned char* qsrc = reinterpret_cast<const unsigned char*>(q16 + (long long)t * kHeads * kRowHalves);
        for (int i = tid; i < kQBytes / 16; i += kThreads) cp_async_16(smem + 16 * i, qsrc + 16 * i, true);
        for (int h = tid; h < kHeads; h += kThreads) wsm[h] = w_scaled[(long long)t * kHeads + h];
    }
    u32* hist_cta = hist ? hist_s : nullptr;
    if (hist)
        for (int i = tid; i < kHistBins; i += kThreads) hist_s[i] = 0u;
    keys.prime_metadata(tid);
    __syncthreads();
    keys.start_copies(tid);  // group 0 also holds the query copied above

    const int g = lane >> 2, c = lane & 3;
    const int mi = lane >> 3;  // ldmatrix: matrix mi = lane / 8, row lane % 8
    const unsigned short* qrow = qs + (8 * (mi >> 1) + (lane & 7)) * kRowHalves + (mi & 1) * 8;
    float* out = scores + (long long)t * ld;
    const int row0 = warp * kPassEntries;  // my warp's 32 rows of a tile

    for (int it = 0; it < num_tiles; ++it) {
        keys.begin_tile(it, tid);

        const unsigned char* st = keys.stage(it);
        // my 4 rows r = 2*mb + hi: tile rows row0 + mb*16 + g + 8*hi
        u32 raw[2 * kMBlocks][kWords];
        u32 sc[2 * kMBlocks][kWords];
#pragma unroll
        for (int r = 0; r < 2 * kMBlocks; ++r)
            read_row<kDim>(st, row0 + (r >> 1) * 16 + g + (r & 1) * 8, c, raw[r], sc[r]);

        float acc[kMBlocks][kNBlocks][4];
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
            for (int j = 0; j < kNBlocks; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[mb][j][i] = 0.0f;

#pragma unroll
        for (int wd = 0; wd < kWords; ++wd) {
            // decode word wd of each row: two k-steps of A fragments
            u32 dec[2 * kMBlocks][4];
#pragma unroll
            for (int r = 0; r < 2 * kMBlocks; ++r) {
                e2m1x8_to_f16x2(raw[r][wd], dec[r]);
#pragma unroll
                for (int i = 0; i < 4; ++i) dec[r][i] = hmul2(dec[r][i], sc[r][wd]);
            }
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int ks = 2 * wd + hh;
#pragma unroll
                for (int jp = 0; jp < kNBlocks; jp += 2) {
                    u32 b[4];
                    ldmatrix_x4(b, qrow + jp * 8 * kRowHalves + ks * 16);
#pragma unroll
                    for (int mb = 0; mb < kMBlocks; ++mb) {
                        const u32 a[4] = {dec[2 * mb][2 * hh], dec[2 * mb + 1][2 * hh],
                                          dec[2 * mb][2 * hh + 1], dec[2 * mb + 1][2 * hh + 1]};
                        mma_16816(acc[mb][jp], a, b[0], b[1]);
                        mma_16816(acc[mb][jp + 1], a, b[2], b[3]);
                    }
                }
            }
        }

        // ---- epilogue: rows g (acc[..][0..1]) and g + 8 (acc[..][2..3]) of each m-block
        const float* gs = keys.gs(it);
        const int tile_start = (first_tile + it) * kTileEntries;
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
            // two partial sums per row (even and odd heads) halve the dependent FMA chain
            float lo0 = 0.0f, lo1 = 0.0f, hi0 = 0.0f, hi1 = 0.0f;
#pragma unroll
            for (int j = 0; j < kNBlocks; ++j) {
                const float w0 = wsm[8 * j + 2 * c], w1 = wsm[8 * j + 2 * c + 1];
                lo0 = fmaf(w0, relu_nan(acc[mb][j][0]), lo0);
                lo1 = fmaf(w1, relu_nan(acc[mb][j][1]), lo1);
                hi0 = fmaf(w0, relu_nan(acc[mb][j][2]), hi0);
                hi1 = fmaf(w1, relu_nan(acc[mb][j][3]), hi1);
            }
            float lo = lo0 + lo1, hi = hi0 + hi1;
            lo += __shfl_xor_sync(FULL_MASK, lo, 1);
            hi += __shfl_xor_sync(FULL_MASK, hi, 1);
            lo += __shfl_xor_sync(FULL_MASK, lo, 2);
            hi += __shfl_xor_sync(FULL_MASK, hi, 2);
            if (c < 2) {  // lane c=0 writes row g, c=1 row g+8
                const int row = row0 + mb * 16 + g + 8 * c;
                store_score(out, tile_start + row, c == 0 ? lo : hi, gs[row], n, hist_cta);
            }
        }
    }
    cp_async_wait<0>();
    if (hist) {
        __syncthreads();
        flush_histogram(hist_s, hist + (long long)t * kHistBins, tid, kThreads);
    }
}
