// score_ks.cu: the fast scoring path for many queries of one sequence, keys stationary
// (Hopper, sm_90a).
//
// The pair kernel (score_wgmma.cu) decodes every key tile once for two queries; here each
// CTA decodes its group of kGroup entries once, keeps them as wgmma A fragments in
// registers for the whole launch, and streams the run's queries past them, one query a
// round: its B operand and weights (the shared-memory image ks_restage_kernel writes from
// prep_query_kernel's staging, 16,640 bytes) come into a ring of kSlots slots by one bulk
// copy each. The warpgroups do not meet at a barrier: each waits for its query's slot
// (an mbarrier the copy completes) and counts itself out of it; the last one out refills
// it, so the warpgroups drift apart and one's epilogue runs under another's MMAs. The decode is paid once per group for all queries of the
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
    static constexpr int kBars = kKeys + score_ks::kWarpgroups * wgmma_stage_bytes(kDim);  // u64[kSlots]
    static constexpr int kCounts = kBars + score_ks::kSlots * 8;          // u32[kSlots]
    static constexpr int kBytes = kCounts + score_ks::kSlots * 4;
};

// q16 [T, 64, kDim + 8] and w_scaled [T, 64] (prep_query_kernel) -> qimg [T][kQSlot bytes]:
// each query's B operand as score_ks_kernel's shared memory holds it (core-matrix layout)
// and its weights, so that one bulk copy brings both. grid (T,), 128 threads.
template <int kDim>
__global__ void __launch_bounds__(128) ks_restage_kernel(const unsigned short* __restrict__ q16,
                                                         const float* __restrict__ w_scaled, int T,
                                                         unsigned char* __restrict__ qimg) {
    using namespace score_wgmma;
    using Smem = KsSmem<kDim>;
    const int t = blockIdx.x;
    if (t >= T) return;
    unsigned char* dst = qimg + (long long)t * Smem::kQSlot;
    const unsigned short* src = q16 + (long long)t * kHeads * (kDim + 8);
    for (int i = threadIdx.x; i < kHeads * (kDim / 8); i += 128) {
        const int h = i / (kDim / 8), kc = i % (kDim / 8);
        *reinterpret_cast<uint4*>(dst + kc * kLbo + (h / 8) * kCoreBytes + (h % 8) * 16) =
            *reinterpret_cast<const uint4*>(src + h * (kDim + 8) + kc * 8);
    }
    if (threadIdx.x < kHeads / 4)
        reinterpret_cast<float4*>(dst + Smem::kQBytes)[threadIdx.x] =
            reinterpret_cast<const float4*>(w_scaled + (long long)t * kHeads)[threadIdx.x];
}

// grid (G, Y), score_ks::kThreads threads, KsSmem<kDim>::kBytes of dynamic shared memory;
// keys_fp4 and key_scale 16-byte aligned, E a power of two (the launcher checks).
template <int kDim>
__global__ void __launch_bounds__(score_ks::kThreads, 1)
score_ks_kernel(const unsigned char* __restrict__ qimg,  // [T][KsSmem::kQSlot] from ks_restage_kernel
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
    {  // a group past every one of my rows' visible entries has nothing to score: leave at once
        __shared__ int s_reach;
        if (tid == 0) s_reach = 0;
        __syncthreads();
        int reach = 0;
        for (int t = t0 + tid; t < t1; t += kThreads) reach = max(reach, visible_len(valid_lens, t, max_len));
        if (reach > base) atomicMax(&s_reach, reach);
        __syncthreads();
        if (s_reach <= base) return;  // the same in every thread
    }
    // entries past every row's reach are never stored; the group's copies of them are skipped
    const int* bt = block_table;  // row 0's table: the sequence's

    u64* full = reinterpret_cast<u64*>(smem + Smem::kBars);      // slot j's query landed
    u32* out_count = reinterpret_cast<u32*>(smem + Smem::kCounts);  // warpgroups done with slot j's query
    // query t into slot j, by one thread: one bulk copy, reported to full[j]
    auto stage_query = [&](int t, int j) {
        mbar_arrive_expect_tx(full + j, (u32)Smem::kQSlot);
        bulk_copy_g2s(smem + j * Smem::kQSlot, qimg + (long long)t * Smem::kQSlot, (u32)Smem::kQSlot, full + j);
    };
    if (tid == 0) {
        for (int j = 0; j < score_ks::kSlots; ++j) {
            mbar_init(full + j, 1);
            out_count[j] = 0u;
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (tid == 0)
        for (int j = 0; j < score_ks::kSlots && t0 + j < t1; ++j) stage_query(t0 + j, j);

    // ---- prologue: the group's keys into one stage a warpgroup (codes, then scales), while
    // the first kSlots queries come in
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
    cp_async_wait<0>();  // the keys
    __syncthreads();

    u32 a_frag[2][kKSteps][4];  // the group's keys, decoded once
#pragma unroll
    for (int u = 0; u < 2; ++u) decode_sub_tile<kDim>(st, u * kSubTile + r0, c, a_frag[u]);
    float acc[2][32];
    const int s_first = base + wg * kTile + r0;  // my row r0 of sub-tile 0

    int n_next = visible_len(valid_lens, t0, max_len);  // each row's length loaded a round ahead
    for (int t = t0; t < t1; ++t) {
        const int slot = (t - t0) % score_ks::kSlots;
        const int n = n_next;
        if (t + 1 < t1) n_next = visible_len(valid_lens, t + 1, max_len);
        // the slot is waited for even by a warpgroup with nothing to score in it: it may count
        // itself out (and the last one out refill it) only once the copy into it has landed
        mbar_wait(full + slot, (u32)((t - t0) / score_ks::kSlots) & 1u);  // query t landed
        const unsigned char* qb = smem + slot * Smem::kQSlot;
        const float* wsm = reinterpret_cast<const float*>(qb + Smem::kQBytes);
        const u64 desc_q = wgmma_desc(qb, kLbo, kCoreBytes);
        float* out = scores + (long long)t * ld;
        auto epilogue = [&](const float (&d)[32], int s0, float g0, float g1) {
            const float2 sums = weighted_head_sums(d, wsm, c);
            if (c < 2) {
                const int s = s0 + 8 * c;
                const float score = (c ? sums.y : sums.x) * (c ? g1 : g0) + 0.0f;  // -0 folded into +0
                if (s < n) out[s] = score;
            }
        };
        if (n > base + wg * kTile) {  // row t sees some of my entries (the same in the warpgroup)
#pragma unroll
            for (int u = 0; u < 2; ++u) mma_sub_tile<kDim>(acc[u], a_frag[u], desc_q);
            wgmma_wait<1>();
            fence_accumulators(acc[0]);
            epilogue(acc[0], s_first, gsc[0][0], gsc[0][1]);
            wgmma_wait<0>();
            fence_accumulators(acc[1]);
            epilogue(acc[1], s_first + kSubTile, gsc[1][0], gsc[1][1]);
        }
        // this warpgroup is done with the slot (its MMAs waited for, its weights read); the
        // last of the warpgroups out refills it with query t + kSlots
        asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
        if (wtid == 0 && atomicAdd(out_count + slot, 1u) == score_ks::kWarpgroups - 1) {
            out_count[slot] = 0u;
            if (t + score_ks::kSlots < t1) {
                fence_proxy_async();
                stage_query(t + score_ks::kSlots, slot);
            }
        }
    }
}
