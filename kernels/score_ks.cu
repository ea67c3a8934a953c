// score_ks.cu: the fast scoring path for many queries of one sequence, keys stationary
// (Hopper, sm_90a).
//
// The pair kernel (score_wgmma.cu) decodes every key tile once for two queries; here each
// CTA decodes its group of kGroup entries once, keeps them as wgmma A fragments in
// registers for the whole launch, and streams the run's queries past them, one query a
// round: its B operand (the staged fp16 query of prep_query_kernel, 16 KB) and weights
// come into a two-slot shared-memory ring by 16-byte asynchronous copies while the
// previous query is multiplied. The decode is paid once per group for all queries of the
// run, and each query tile read from L2 serves kGroup entries. scripts/probe_ceiling.py
// measured this loop order's tile loop at 1.12-1.13 x the floor's share a tile
// (wgmma_tile_kernel<3>), against ~1.45 for the pair kernel's steady state.
//
// All rows of a launch read the keys of row 0's block table (one sequence); row t's
// scores are stored for its visible entries only (s < valid_lens[t]), so causal rows that
// end inside a group are masked there. No histogram: the select counts one by its own
// kernel over the scores (each round is another row, so no per-CTA histogram applies).
//
// CTA: kWarpgroups warpgroups, warpgroup w holding entries base + 128 w .. + 127 (two
// 64-entry sub-tiles, their own accumulators); grid (G, Y): group x of ceil(max_len /
// kGroup), query rows y * rows_per_cta .. of the run.
#include "wgmma_common.cuh"

namespace score_ks {
constexpr int kWarpgroups = 3;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kGroup = score_wgmma::kTile * kWarpgroups;  // entries a CTA holds
constexpr int kSlots = 4;  // query ring: queries t + 1 .. t + kSlots - 1 in flight during round t
}  // namespace score_ks

template <int kDim>
struct KsSmem {
    static constexpr int kQBytes = (kDim / 8) * score_wgmma::kLbo;         // one query's B
    static constexpr int kQSlot = kQBytes + score_wgmma::kHeads * 4;       // B, then its 64 weights
    static constexpr int kKeys = score_ks::kSlots * kQSlot;                // the key stages, one a warpgroup
    static constexpr int kBytes = kKeys + score_ks::kWarpgroups * wgmma_stage_bytes(kDim);
};

// grid (G, Y), score_ks::kThreads threads, KsSmem<kDim>::kBytes of dynamic shared memory;
// keys_fp4 and key_scale 16-byte aligned, E a power of two (the launcher checks).
template <int kDim>
__global__ void __launch_bounds__(score_ks::kThreads, 1)
score_ks_kernel(const unsigned short* __restrict__ q16,  // [T, 64, kDim + 8] from prep_query_kernel<kDim, 8>
                const float* __restrict__ w_scaled,      // [T, 64]
                const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                const u8* __restrict__ key_scale,        // [P, E, D/16]
                const float* __restrict__ key_gscale,    // [P]
                const int* __restrict__ block_table,     // [T, L]: row 0's is read
                const int* __restrict__ valid_lens,      // [T]
                int T, int P, int E, int e_shift, int L, int rows_per_cta,
                float* __restrict__ scores,              // [T, ld] workspace
                long long ld)
{
    using namespace score_wgmma;
    using Smem = KsSmem<kDim>;
    using Ring = BulkRing<kDim>;  // the stage layout decode_sub_tile reads
    constexpr int kKSteps = kDim / 16;
    constexpr int kRowHalves = kDim + 8;
    constexpr int kThreads = score_ks::kThreads;
    // D = 128 (the launcher's condition): a 16-byte scale piece then holds two rows of one block
    static_assert(kDim == 128, "D = 128 only");
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, lane = tid & 31, warp = wtid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int max_len = L * E;
    const int base = blockIdx.x * score_ks::kGroup;  // the CTA's first entry
    const int t0 = blockIdx.y * rows_per_cta, t1 = min(T, t0 + rows_per_cta);
    if (t0 >= t1) return;
    // entries past every row's reach are never stored; the group's copies of them are skipped
    const int* bt = block_table;  // row 0's table: the sequence's

    // one query's B (core-matrix layout) and weights into ring slot `slot`, by every thread
    auto stage_query = [&](int t, int slot) {
        unsigned char* qb = smem + slot * Smem::kQSlot;
        const unsigned short* qsrc = q16 + (long long)t * kHeads * kRowHalves;
        for (int i = tid; i < kHeads * (kDim / 8); i += kThreads) {
            const int h = i / (kDim / 8), kc = i % (kDim / 8);
            cp_async_16(qb + kc * kLbo + (h / 8) * kCoreBytes + (h % 8) * 16, qsrc + h * kRowHalves + kc * 8, true);
        }
        if (tid < kHeads / 4)
            cp_async_16(qb + Smem::kQBytes + 16 * tid, w_scaled + (long long)t * kHeads + 4 * tid, true);
        cp_async_commit();
    };
    constexpr int kAhead = score_ks::kSlots - 2;  // commit groups newer than the current query's

    // ---- prologue: the group's keys into one stage a warpgroup (codes, then scales), the
    // first query into slot 0
    unsigned char* st = smem + Smem::kKeys + wg * wgmma_stage_bytes(kDim);
    {
        constexpr int kCodeChunks = Ring::kCodeBytes / 16;  // 16-byte pieces of a row's codes
        for (int i = wtid; i < kTile * kCodeChunks; i += 128) {
            const int r = i / kCodeChunks, piece = i % kCodeChunks;
            const int s = base + wg * kTile + r;
            const int b = s < max_len ? bt[s >> e_shift] : -1;
            const bool ok = b >= 0 && b < P;
            const long long ent = (long long)(ok ? b : 0) * E + (s & (E - 1));
            cp_async_16(st + r * Ring::kCodeBytes + 16 * piece, keys_fp4 + ent * Ring::kCodeBytes + 16 * piece, ok);
        }
        // scales: 16 bytes hold 16 / kScaleBytes whole rows (E >= that: rows of one block)
        constexpr int kRowsPerPiece = 16 / Ring::kScaleBytes;
        for (int i = wtid; i < kTile / kRowsPerPiece; i += 128) {
            const int r = i * kRowsPerPiece, s = base + wg * kTile + r;
            const int b = s < max_len ? bt[s >> e_shift] : -1;
            const bool ok = b >= 0 && b < P;
            const long long ent = (long long)(ok ? b : 0) * E + (s & (E - 1));
            cp_async_16(st + Ring::kScaleOffset + r * Ring::kScaleBytes, key_scale + ent * Ring::kScaleBytes, ok);
        }
        cp_async_commit();
    }
    for (int j = 0; j < score_ks::kSlots - 1; ++j) {  // queries t0 .. t0 + kSlots - 2, a commit group each
        if (t0 + j < t1) stage_query(t0 + j, j);
        else cp_async_commit();  // empty: every round's wait counts the same groups
    }
    // the global scales of my four rows (NaN for an id out of range: never selected)
    const int r0 = 16 * warp + g;
    float gsc[2][2];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int s = base + wg * kTile + u * kSubTile + r0 + 8 * h;
            const int b = s < max_len ? bt[s >> e_shift] : -1;
            gsc[u][h] = (b >= 0 && b < P) ? key_gscale[b] : __int_as_float(0x7fc00000);
        }
    cp_async_wait<kAhead>();  // the keys and the first query
    fence_proxy_async();  // the first query, written through the generic proxy, is read by wgmma
    __syncthreads();

    u32 a_frag[2][kKSteps][4];  // the group's keys, decoded once
#pragma unroll
    for (int u = 0; u < 2; ++u) decode_sub_tile<kDim>(st, u * kSubTile + r0, c, a_frag[u]);
    float acc[2][32];
    const int s_first = base + wg * kTile + r0;  // my row r0 of sub-tile 0

    for (int t = t0; t < t1; ++t) {
        const int slot = (t - t0) % score_ks::kSlots;
        if (t > t0) {
            cp_async_wait<kAhead>();  // query t landed (this thread's copies)
            fence_proxy_async();
            __syncthreads();          // everyone's landed; everyone is done with query t - 1's slot
        }
        const int ahead = t + score_ks::kSlots - 1;  // into query t - 1's slot
        if (ahead < t1) stage_query(ahead, (slot + score_ks::kSlots - 1) % score_ks::kSlots);
        else cp_async_commit();
        const unsigned char* qb = smem + slot * Smem::kQSlot;
        const float* wsm = reinterpret_cast<const float*>(qb + Smem::kQBytes);
        const u64 desc_q = wgmma_desc(qb, kLbo, kCoreBytes);
        const int n = visible_len(valid_lens, t, max_len);
        float* out = scores + (long long)t * ld;
        auto epilogue = [&](const float (&d)[32], int s0, float g0, float g1) {
            const float2 sums = weighted_head_sums(d, wsm, c);
            if (c < 2) {
                const int s = s0 + 8 * c;
                const float score = (c ? sums.y : sums.x) * (c ? g1 : g0) + 0.0f;  // -0 folded into +0
                if (s < n) out[s] = score;
            }
        };
#pragma unroll
        for (int u = 0; u < 2; ++u) mma_sub_tile<kDim>(acc[u], a_frag[u], desc_q);
        wgmma_wait<1>();
        fence_accumulators(acc[0]);
        epilogue(acc[0], s_first, gsc[0][0], gsc[0][1]);
        wgmma_wait<0>();
        fence_accumulators(acc[1]);
        epilogue(acc[1], s_first + kSubTile, gsc[1][0], gsc[1][1]);
    }
}
