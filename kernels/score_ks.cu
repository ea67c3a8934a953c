// score_ks.cu: the fast scoring path for many queries of one sequence, keys stationary
// (Hopper, sm_90a).
//
// The pair kernel (score_wgmma.cu) decodes every key tile once for two queries; here a
// CTA decodes a group of kGroup entries once, keeps them as wgmma A fragments in
// registers, and streams the run's queries past them, one query a round: its B operand,
// weights and visible length (the shared-memory image ks_prep_kernel writes from the fp32
// query, 16,656 bytes) come into a ring of kSlots slots by one bulk copy each. The
// warpgroups do not meet at a barrier: each waits for its query's slot (an mbarrier the
// copy completes) and counts itself out of it; the last one out refills it, so the
// warpgroups drift apart and one's epilogue runs under another's MMAs. The decode is paid
// once per group for many queries, and each query tile read from L2 serves kGroup
// entries. scripts/probe_ceiling.py measured this loop order's tile loop at 1.12-1.13 x
// the floor's share a tile (wgmma_tile_kernel<3>), against ~1.45 for the pair kernel's
// steady state.
//
// A launch takes up to kMaxSeqs sequences (cu_seqlens), each sequence's rows reading the
// keys of its first row's block table; row t's scores are stored for its visible entries
// only (s < valid_lens[t]), so causal rows that end inside a group are masked there. No
// histogram: the select counts one by its own kernel over the scores (each round is
// another row, so no per-CTA histogram applies).
//
// CTA: kWarpgroups warpgroups, warpgroup w holding entries base + 128 w .. + 127 of the
// group it works on (two 64-entry sub-tiles, their own accumulators); one CTA an SM, each
// taking an equal share of the run's (group, row) items (see score_ks_kernel).
#include "wgmma_common.cuh"

namespace score_ks {
constexpr int kWarpgroups = 3;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kGroup = score_wgmma::kTile * kWarpgroups;  // entries a CTA holds
constexpr int kSlots = 4;  // query ring: queries t + 1 .. t + kSlots - 1 in flight during round t
constexpr int kMaxSeqs = 256;  // sequences a launch takes (geometry.KS_MAX_SEQS)
}  // namespace score_ks

// A slot of the query ring: the image one bulk copy brings (B, its 64 weights, the row's
// visible length and 12 bytes of padding), then the slot's mbarrier and the count of
// warpgroups done with it, so that one register (the slot's window address) locates all
// three.
template <int kDim>
struct KsSmem {
    static constexpr int kQBytes = (kDim / 8) * score_wgmma::kLbo;         // one query's B
    static constexpr int kWeights = kQBytes;                               // its 64 weights (PrepToKsImage)
    static constexpr int kLen = kWeights + score_wgmma::kHeads * 4;        // the row's visible length
    static constexpr int kQImage = kLen + 16;                              // bytes ks_prep_kernel writes a row
    static constexpr int kBar = kQImage;                                   // u64: the slot's query landed
    static constexpr int kCount = kBar + 8;                                // u32: warpgroups done with it
    // a slot's bytes, a multiple of 128, so that B's core matrices (128 bytes each) start on
    // 128-byte lines (16-byte aligned slots, which the descriptor allows, measured the same)
    static constexpr int kQSlot = (kQImage + 16 + 127) / 128 * 128;
    static constexpr int kKeys = score_ks::kSlots * kQSlot;                // the key stages, one a warpgroup
    static constexpr int kBytes = kKeys + score_ks::kWarpgroups * wgmma_stage_bytes(kDim);
};

// prep_query_row's output (fast_common.cuh) as score_ks_kernel's query images, qimg
// [T][kQImage bytes]: each query's B operand as that kernel's shared memory holds it
// (core-matrix layout: slot pair pr of head h in the 16-byte chunk pr / 4 of its K chunk),
// its weights after it, then its visible length (ks_prep_kernel), so that one bulk copy
// brings all three. No padding slots.
template <int kDim>
struct PrepToKsImage {
    unsigned char* __restrict__ qimg;
    static constexpr int kPairs = kDim / 2;
    __device__ __forceinline__ void pair(int t, int h, int pr, u32 v) const {
        using namespace score_wgmma;
        *reinterpret_cast<u32*>(qimg + (long long)t * KsSmem<kDim>::kQImage + (pr / 4) * kLbo + (h / 8) * kCoreBytes +
                                (h % 8) * 16 + (pr % 4) * 4) = v;
    }
    // the weights in the order the kernel's lanes read them (lane_order_weight)
    __device__ __forceinline__ void weight(int t, int h, float v) const {
        reinterpret_cast<float*>(qimg + (long long)t * KsSmem<kDim>::kQImage + KsSmem<kDim>::kWeights)[lane_order_weight(h)] =
            v;
    }
};

// q [T, H, kDim] and w [T, H] float32 -> qimg [T][kQImage] (PrepToKsImage): the query staging
// of prep_query_kernel (the same fp16 values), written straight into the images, one launch
// and no staged rows; and row t's visible length (valid_lens[t] clamped to [0, max_len]),
// which the scoring kernel then reads from shared memory with the query. grid (T, 64 / 16),
// 256 threads.
template <int kDim, class QT = float>  // q: float, half_bits, bf16_bits or e4m3_bits (common.cuh)
__global__ void __launch_bounds__(256) ks_prep_kernel(const QT* __restrict__ q, const float* __restrict__ w, int H,
                                                      const int* __restrict__ valid_lens, int max_len,
                                                      unsigned char* __restrict__ qimg) {
    if (blockIdx.y == 0 && threadIdx.x == 0)
        *reinterpret_cast<int4*>(qimg + (long long)blockIdx.x * KsSmem<kDim>::kQImage + KsSmem<kDim>::kLen) =
            make_int4(visible_len(valid_lens, blockIdx.x, max_len), 0, 0, 0);
    prep_query_row<kDim, score_wgmma::kHeads / 8>(q, w, H, PrepToKsImage<kDim>{qimg});
}

// grid (C,): one CTA an SM, score_ks::kThreads threads, KsSmem<kDim>::kBytes of dynamic
// shared memory; keys_fp4 and key_scale 16-byte aligned, E a power of two (the launcher
// checks). The run's work is its (sequence, group, row) items: sequence by sequence, each
// sequence's groups 0 .. of kGroup entries up to its longest visible row in the run, every
// one of its rows in the run for each. CTA i takes items [W i / C, W (i + 1) / C) of the
// W: equal shares whatever W is (the groups alone, one a CTA, left a last wave of 23 CTAs
// on 132 SMs for prefill-chunk: 14% of the kernel idle). A share spans a few (sequence,
// group) pairs; it decodes each once.
template <int kDim>
__global__ void __launch_bounds__(score_ks::kThreads, 1)
score_ks_kernel(const unsigned char* __restrict__ qimg,  // [T][KsSmem::kQImage] from ks_prep_kernel
                const u8* __restrict__ keys_fp4,         // [P, E, D/2]
                const u8* __restrict__ key_scale,        // [P, E, D/16]
                const float* __restrict__ key_gscale,    // [P]
                const int* __restrict__ block_table,     // [T, L]: a sequence's first row's is read
                const int* __restrict__ valid_lens,      // [T]
                const int* __restrict__ cu_seqlens,      // [n_seq + 1]: the call's sequences' rows
                int n_seq, int run_first, int T,         // the run: the call's rows run_first .. + T - 1
                int P, int E, int e_shift, int L,
                float* __restrict__ scores,              // [T, ld] workspace
                long long ld)
{
    using namespace score_wgmma;
    using Smem = KsSmem<kDim>;
    using Ring = BulkRing<kDim>;  // the stage layout decode_sub_tile reads
    constexpr int kKSteps = kDim / 16;
    constexpr int kThreads = score_ks::kThreads;
    constexpr int kSlots = score_ks::kSlots;
    // D = 128 (the launcher's condition): a 16-byte scale piece then holds two rows of one block
    static_assert(kDim == 128, "D = 128 only");
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, lane = tid & 31, warp = wtid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int max_len = L * E;
    // the query ring by window addresses: slot j at ring0 + j kQSlot (KsSmem: its image, its
    // barrier, its count of warpgroups done)
    const u32 ring0 = smem_u32(smem);

    // ---- the run's work: for each sequence b, its rows in the run (s_cu[b] .. s_cu[b + 1] -
    // 1, relative to the run) times its groups up to its longest visible row (groups past
    // every row of a sequence are no work); s_items[b]: the items of the sequences before b
    __shared__ int s_cu[score_ks::kMaxSeqs + 1], s_reach[score_ks::kMaxSeqs];
    __shared__ long long s_items[score_ks::kMaxSeqs + 1];
    if (tid == 0) {
        for (int j = 0; j < kSlots; ++j) {
            mbar_init(reinterpret_cast<u64*>(smem + j * Smem::kQSlot + Smem::kBar), 1);
            *reinterpret_cast<u32*>(smem + j * Smem::kQSlot + Smem::kCount) = 0u;
        }
        mbar_init_fence();
    }
    for (int b = tid; b <= n_seq; b += kThreads) {
        s_cu[b] = min(max(cu_seqlens[b] - run_first, 0), T);
        if (b < n_seq) s_reach[b] = 0;
    }
    __syncthreads();
    if (tid == 0)  // offsets out of order (validation off) made monotone: every sequence >= 0 rows
        for (int b = 1; b <= n_seq; ++b) s_cu[b] = max(s_cu[b], s_cu[b - 1]);
    __syncthreads();
    // row t's sequence: the last b whose rows start at or before t (empty ones skipped)
    auto seq_of = [&](int t) { return item_of_tile(s_cu, n_seq, t); };
    // a warp's rows are consecutive, so mostly of one sequence: one atomic a warp then
    for (int t0 = tid - lane; t0 < T; t0 += kThreads) {  // the same trips in every lane
        const int t = min(t0 + lane, T - 1), b = seq_of(t);  // past T: row T - 1 again
        const int n = visible_len(valid_lens, t, max_len), b0 = __shfl_sync(0xffffffffu, b, 0);
        if (__all_sync(0xffffffffu, b == b0)) {
            const int m = __reduce_max_sync(0xffffffffu, n);
            if (lane == 0 && m > 0) atomicMax(&s_reach[b0], m);
        } else if (n > 0) {
            atomicMax(&s_reach[b], n);
        }
    }
    __syncthreads();
    if (tid == 0) {  // at most kMaxSeqs sequences: a serial scan
        long long sum = 0;
        for (int b = 0; b < n_seq; ++b) {
            s_items[b] = sum;
            sum += (long long)((s_reach[b] + score_ks::kGroup - 1) / score_ks::kGroup) * (s_cu[b + 1] - s_cu[b]);
        }
        s_items[n_seq] = sum;
    }
    __syncthreads();
    const long long work = s_items[n_seq];
    const long long k0 = work * blockIdx.x / gridDim.x, k1 = work * (blockIdx.x + 1) / gridDim.x;
    const int items = (int)(k1 - k0);  // <= work / C + 1
    if (items <= 0) return;  // the same in every thread
    // the (sequence, group, row) of item k: the sequence whose items hold it, then group-major
    struct Item {
        int b, grp, t;  // t: the row within the run
    };
    auto item_at = [&](long long k) {
        const int lo = item_of_tile(s_items, n_seq, k);  // the last b with s_items[b] <= k (one with items)
        const int rows = s_cu[lo + 1] - s_cu[lo];
        const long long local = k - s_items[lo];
        return Item{lo, (int)(local / rows), s_cu[lo] + (int)(local % rows)};
    };
    // row t's query image into the slot at window address slot, by one thread: one bulk copy
    auto stage_query = [&](int t, u32 slot) {
        mbar_arrive_expect_tx(slot + Smem::kBar, (u32)Smem::kQImage);
        bulk_copy_g2s(slot, qimg + (long long)t * Smem::kQImage, (u32)Smem::kQImage, slot + Smem::kBar);
    };
    if (tid == 0)
        for (int j = 0; j < kSlots && j < items; ++j) stage_query(item_at(k0 + j).t, ring0 + j * Smem::kQSlot);

    unsigned char* st = smem + Smem::kKeys + wg * wgmma_stage_bytes(kDim);
    const int r0 = 16 * warp + g;  // my first row of a sub-tile
    u32 a_frag[2][kKSteps][4];     // the group's keys, decoded once
    float gsc[2][2];               // the global scales of my four rows (NaN for an id out of range)
    float acc[2][32];
    // a group's keys for my warpgroup's 128 entries from `first`: codes and scales into my
    // stage, then decoded into a_frag (the stage is mine alone: a warpgroup barrier suffices)
    auto load_keys = [&](const int* bt, int first) {
        // entry s's block id (-1 past the table or outside the pool) and pool row (block 0's
        // for -1: a copy not made)
        auto block_at = [&](int s) {
            const int b = s < max_len ? bt[s >> e_shift] : -1;
            return b >= 0 && b < P ? b : -1;
        };
        auto pool_row = [&](int b, int s) { return (long long)max(b, 0) * E + (s & (E - 1)); };
        constexpr int kCodeChunks = Ring::kCodeBytes / 16;  // 16-byte pieces of a row's codes
        for (int i = wtid; i < kTile * kCodeChunks; i += 128) {
            const int r = i / kCodeChunks, piece = i % kCodeChunks, s = first + r, b = block_at(s);
            cp_async_16(st + r * Ring::kCodeBytes + 16 * piece,
                        keys_fp4 + pool_row(b, s) * Ring::kCodeBytes + 16 * piece, b >= 0);
        }
        // scales: 16 bytes hold 16 / kScaleBytes whole rows (E >= that: rows of one block)
        constexpr int kRowsPerPiece = 16 / Ring::kScaleBytes;
        for (int i = wtid; i < kTile / kRowsPerPiece; i += 128) {
            const int r = i * kRowsPerPiece, s = first + r, b = block_at(s);
            cp_async_16(st + Ring::kScaleOffset + r * Ring::kScaleBytes,
                        key_scale + pool_row(b, s) * Ring::kScaleBytes, b >= 0);
        }
        cp_async_commit();
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int b = block_at(first + u * kSubTile + r0 + 8 * h);
                gsc[u][h] = b >= 0 ? key_gscale[b] : __int_as_float(0x7fc00000);
            }
        cp_async_wait<0>();
        asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");  // every thread's copies landed
#pragma unroll
        for (int u = 0; u < 2; ++u) decode_sub_tile<kDim>(st, u * kSubTile + r0, c, a_frag[u]);
    };

    // my share: from item k0, runs of rows of one (sequence, group), a group's keys decoded
    // once for all its rows in the run. The round's bookkeeping is kept to registers advanced
    // each round: the kernel's time follows its round's instruction count (docs/performance.md
    // v50), and the slot's address and phase made from i, the row's length loaded from global
    // memory and clamped, the score's address made from t and the weights loaded twice took
    // ~30 of ~246 a round (v51: 216 now, the scoring 3.4% faster).
    int i = 0;                            // my item: the ring's round
    u32 slot = ring0, parity = 0u;        // its slot (window address) and the phase to wait for
    const u32 my_weights = Smem::kWeights + 16 * c;  // my first 16 bytes of weights in a slot (lane_order_weight)
    const int r_mine = r0 + 8 * (c & 1);  // my row of a sub-tile, which lanes c < 2 store
    for (long long k = k0; k < k1;) {
        const Item at = item_at(k);
        const int first = at.grp * score_ks::kGroup + wg * kTile;  // my warpgroup's first entry
        load_keys(block_table + (long long)s_cu[at.b] * L, first);  // the sequence's table
        const int tb = (int)min((long long)s_cu[at.b + 1], at.t + (k1 - k));
        k += tb - at.t;
        // my entry of sub-tile u: s_mine + 64 u; lanes c >= 2 compute lanes 0 and 1's scores
        // again and store nothing (a bound no length reaches)
        const int s_mine = first + r_mine, s_test = c < 2 ? s_mine : 0x7fffffff - kSubTile;
        float* dst = scores + (long long)at.t * ld + s_mine;  // row t's, one row on each round
        for (int t = at.t; t < tb; ++t, ++i, dst += ld) {
            mbar_wait(slot + Smem::kBar, parity);  // query t landed
            const int n = ld_shared_s32(slot + Smem::kLen);  // its visible length (ks_prep_kernel)
            const u64 desc_q = wgmma_desc_of(((slot & 0x3ffffu) >> 4) | ((u32)(kLbo >> 4) << 16), kCoreBytes);
            // every warpgroup multiplies, even for a row that ends before its entries (it
            // stores nothing then): a skip here measured 2% slower on prefill-chunk
#pragma unroll
            for (int u = 0; u < 2; ++u) mma_sub_tile<kDim>(acc[u], a_frag[u], desc_q);
            // my weights, once for both sub-tiles (a load after the accumulators' fences, whose
            // memory clobbers made the compiler load them again for the second)
            LaneWeights wq;
#pragma unroll
            for (int piece = 0; piece < 4; ++piece) wq.v[piece] = ld_shared_f4(slot + my_weights + 64 * piece);
            auto epilogue = [&](const float (&d)[32], int u, float g0, float g1) {
                const float mine = weighted_head_sum_mine_of(d, wq, c);
                const float score = mine * (c & 1 ? g1 : g0) + 0.0f;  // -0 folded into +0
                store_global_if(dst + u * kSubTile, score, s_test + u * kSubTile < n);
            };
            wgmma_wait<1>();
            fence_accumulators(acc[0]);
            epilogue(acc[0], 0, gsc[0][0], gsc[0][1]);
            wgmma_wait<0>();
            fence_accumulators(acc[1]);
            epilogue(acc[1], 1, gsc[1][0], gsc[1][1]);
            // this warpgroup is done with the slot (its MMAs waited for, its weights read); the
            // last of the warpgroups out refills it with my item i + kSlots
            asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
            if (wtid == 0 && atomic_add_shared(slot + Smem::kCount, 1u) == score_ks::kWarpgroups - 1) {
                st_shared_u32(slot + Smem::kCount, 0u);
                if (i + kSlots < items) {  // my item i + kSlots: row t + kSlots of this run, or found
                    fence_proxy_async();
                    stage_query(t + kSlots < tb ? t + kSlots : item_at(k0 + i + kSlots).t, slot);
                }
            }
            const bool wrap = slot == ring0 + (kSlots - 1) * Smem::kQSlot;
            slot = wrap ? ring0 : slot + Smem::kQSlot;
            parity ^= wrap ? 1u : 0u;
        }
    }
}
