// score_dense.cu: the fast scoring path for many queries of a sequence over few keys
// (prefill from a short or empty cache; Hopper, sm_90a, D = 128, H <= 64).
//
// Where a sequence's keys are few and its queries many (prefill-8K: 2,048 entries, 8,192
// rows), decoding the NVFP4 keys again for every pair of rows (the pair kernel) spends
// more issue slots on the decode than the tensor cores need for the MMAs. Here the keys
// are decoded once, by dense_keys_kernel, into an fp16 image of wgmma A operands (64
// entries a unit, 16 KB, with the entries' global scales beside it: 16,640 bytes, small
// enough to stay in L2), and score_dense_kernel runs a plain GEMM over it:
//   * an item is kQueries (3) consecutive rows of one sequence; their queries, staged from
//     fp32 by the CTA itself (QueryStaging: each head scaled by a power of two, rounded to
//     fp16), are one B operand of 192 columns (3 queries x 64 heads);
//   * a unit is one 64-entry sub-tile of an item's keys: one bulk copy of its image into
//     a ring stage, then eight m64n192k16 MMAs with both operands in shared memory;
//   * the epilogue is the other kernels' arithmetic (ReLU keeping NaN, head weights, the
//     sum over the heads in the thread and its quad, the entry's global scale), its quad
//     sums scattered so that lane c stores query c's scores, for entries below each row's
//     visible length: the warp-specialised kernel's scores bit for bit (same fp16
//     operands, K order and association).
// No histogram: the select counts one by its own kernel where it needs one. With a
// workspace at rest, each CTA counts the scores it has stored of its share's rows
// (row_ready, common.cuh) at its end, so that the row select, placed on the SMs this
// kernel's CTAs leave, selects each row as soon as the CTAs holding it have ended rather
// than after the whole grid (its CTAs end up to ~21 K cycles apart, v54).
//
// CTA: four warpgroups, one CTA an SM. Warpgroup 0 stages the queries of the CTA's items
// into three B buffers (up to two items ahead of the MMAs: with two buffers, v33, an item
// of short causal rows left too little time for the next item's staging); warpgroups 1-3
// take the units in turn, each refilling the ring stage it has just read with its unit
// four ahead. A unit's epilogue (~300 instructions a thread) takes longer than one unit's
// MMAs: with two MMA warpgroups (v34) the tensor cores idled a third of the time, waiting
// for it; with three, each epilogue has two units' MMAs to hide under. The turns (below)
// keep the ring's phases in order: unit u + 4 is a different warpgroup's than unit u, and
// only the turns make sure that unit u has landed (its phase of the stage completed)
// before anyone waits for unit u + 4's phase, which has the same parity. The run's units are
// cut into equal shares, one a CTA; items are taken in a zigzag order (first, last,
// second, ...) so that every share holds short and long causal rows alike, and its
// query staging is spread over the whole kernel.
// K order: score_ws.cu's (slot i of k-chunk kc holds dim 8 kc + (i with bits 0 and 1
// swapped)), the order QueryStaging::store_chunked stages the query in.
#include "wgmma_common.cuh"

namespace score_dense {
constexpr int kDim = 128;                      // the head dim this kernel takes
constexpr int kSub = 64;                       // entries a unit (M of the MMA)
constexpr int kQueries = 3;                    // rows an item (a fourth's B buffers would not fit beside the ring)
constexpr int kBuffers = 3;                    // B buffers: items staged ahead of the MMAs' (kBuffers - 1)
constexpr int kN = 64 * kQueries;              // N of the MMA: the item's queries' heads
constexpr int kALbo = (kSub / 8) * 128;        // A: bytes between core matrices along K
// B: the same, padded by 32 bytes: the staging's stores (QueryStaging::store_chunked) write
// four consecutive K chunks in one instruction, which at a multiple of 128 bytes apart fell
// on the same banks (eight wavefronts a store where two do; v52)
constexpr int kBLbo = (kN / 8) * 128 + 32;
constexpr int kImgA = kSub * kDim * 2;         // a unit's fp16 keys
constexpr int kImg = kImgA + kSub * 4;         // ... and their global scales (geometry.DENSE_UNIT_BYTES)
constexpr int kBBytes = (kDim / 8) * kBLbo;    // one B buffer
constexpr int kStages = 4;                     // the key ring (units in flight)
constexpr int kMmaGroups = 3;                  // MMA warpgroups, taking the units in turn
constexpr int kThreads = 128 * (1 + kMmaGroups);  // staging warpgroup, the MMA warpgroups (geometry.DENSE_THREADS)
constexpr int kMaxItems = 2988;                // items a run (geometry.DENSE_MAX_ROWS / kQueries + DENSE_MAX_SEQS, rounded up)
constexpr int kMaxSeqs = 256;                  // sequences a launch (geometry.DENSE_MAX_SEQS)
constexpr int kTurnBarrier = 1 + kMmaGroups;   // named barriers 1 + m: MMA warpgroup m's own; kTurnBarrier + m: its turn
constexpr int kEndBarrier = kTurnBarrier + kMmaGroups;  // the MMA warpgroups' stores all done (row_ready)
}  // namespace score_dense

struct DenseSmem {
    static constexpr int kB = 0;                                                          // [kBuffers][kBBytes]
    static constexpr int kW = kB + score_dense::kBuffers * score_dense::kBBytes;          // float [kBuffers][kN]: scaled weights
    static constexpr int kRing = kW + score_dense::kBuffers * score_dense::kN * 4;        // [kStages][kImg]
    static constexpr int kBars = kRing + score_dense::kStages * score_dense::kImg;         // u64: key full, B full, B empty
    static constexpr int kMeta = kBars + (score_dense::kStages + 2 * score_dense::kBuffers) * 8;  // int [kBuffers][8]
    static constexpr int kStart = kMeta + score_dense::kBuffers * 8 * 4;                  // int [kMaxItems + 1]
    static constexpr int kBytes = kStart + (score_dense::kMaxItems + 1) * 4;
    static_assert(kRing % 128 == 0 && score_dense::kImg % 128 == 0 && kBars % 8 == 0, "operand and barrier alignment");
};

// The item's MMA: A (64 entries) x B (kQueries queries' 64 heads)
template <int kCols>
struct DenseMma;
template <>
struct DenseMma<192> {
    __device__ static void run(float (&d)[96], u64 a, u64 b, int acc) { wgmma_m64n192k16_ss(d, a, b, acc); }
};

// The rows of sequence b in the run [run_first, run_first + T): [start(b), start(b + 1)),
// offsets clamped to the run and made monotone (validation off), as score_ks_kernel does.
__device__ __forceinline__ int run_row(const int* __restrict__ cu_seqlens, int b, int run_first, int T) {
    return min(max(cu_seqlens[b] - run_first, 0), T);
}

// Sequence b's keys (its first row's block table in the run) -> kimg[b][j], j < J =
// ceil(L * E / 64): unit j's 64 entries as an fp16 wgmma A operand (e2m1 x e4m3 x 2^-8,
// exact; zeros past the table or for a block id outside the pool) and their global scales
// (NaN for those). grid (J, n_seq), 256 threads: entry e = tid / 4, 32 dims a thread.
template <int kDim>
__global__ void __launch_bounds__(256) dense_keys_kernel(const u8* __restrict__ keys_fp4,   // [P, E, D/2]
                                                         const u8* __restrict__ key_scale,  // [P, E, D/16]
                                                         const float* __restrict__ key_gscale,  // [P]
                                                         const int* __restrict__ block_table,   // [T, L]
                                                         const int* __restrict__ cu_seqlens, int n_seq,
                                                         int run_first, int T, int P, int E, int e_shift, int L,
                                                         unsigned char* __restrict__ kimg, int J) {
    using namespace score_dense;
    static_assert(kDim == 128, "D = 128 only");
    // the scoring kernel, launched after this one with programmatic dependent launch, may
    // be placed now: it builds its schedule on the SMs this short grid leaves idle and waits
    // for this grid's end before it reads the image
    let_next_grid_start();
    const int j = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
    __shared__ int s_first, s_end;
    if (tid == 0) {  // the scoring kernel's clamped, monotone offsets
        int lo = 0, hi = 0;
        for (int i = 0; i <= b + 1; ++i) {
            lo = hi;
            hi = max(hi, run_row(cu_seqlens, i, run_first, T));
        }
        s_first = lo;
        s_end = hi;
    }
    __syncthreads();
    if (s_first >= s_end) return;  // no rows of this sequence in the run: its image is never read
    const int e = tid >> 2, qd = tid & 3, s = j * kSub + e, max_len = L * E;
    const int blk0 = s < max_len ? block_table[(long long)s_first * L + (s >> e_shift)] : -1;
    const bool ok = blk0 >= 0 && blk0 < P;
    unsigned char* dst = kimg + ((long long)b * J + j) * kImg;
    uint4 code = make_uint4(0u, 0u, 0u, 0u);  // zeros decode to zeros
    u32 scale2 = 0u;
    if (ok) {
        const long long ent = (long long)blk0 * E + (s & (E - 1));
        code = *reinterpret_cast<const uint4*>(keys_fp4 + ent * (kDim / 2) + 16 * qd);
        scale2 = *reinterpret_cast<const unsigned short*>(key_scale + ent * (kDim / 16) + 2 * qd);
    }
    decode_quarter_chunked(dst, kALbo, e, qd, code, scale2);
    if (qd == 0) reinterpret_cast<float*>(dst + kImgA)[e] = ok ? key_gscale[blk0] : __int_as_float(0x7fc00000);
}

// grid (C,): one CTA an SM, score_dense::kThreads threads, DenseSmem::kBytes of dynamic
// shared memory; q 16-byte aligned (the launcher checks), kimg from dense_keys_kernel for
// the same run. Row t's scores are stored for s < valid_lens[t] only.
template <int kDim, class QT = float>
__global__ void __launch_bounds__(score_dense::kThreads, 1)
score_dense_kernel(const QT* __restrict__ q,                // [T, H, kDim] (float, half_bits, bf16_bits or e4m3_bits): staged here
                   const float* __restrict__ w,             // [T, H]
                   int H,
                   const unsigned char* __restrict__ kimg,  // [n_seq][J][kImg]
                   int J,
                   const int* __restrict__ valid_lens,      // [T]
                   const int* __restrict__ cu_seqlens,      // [n_seq + 1]: the call's sequences' rows
                   int n_seq, int run_first, int T, int max_len,
                   float* __restrict__ scores,              // [T, ld] workspace
                   long long ld,
                   u32* __restrict__ row_ready)             // [T]: scores stored a row (common.cuh), or null
{
    using namespace score_dense;
    static_assert(kDim == score_dense::kDim, "D = 128 only");
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int s_cu[kMaxSeqs + 1], s_items[kMaxSeqs + 1];
    __shared__ u32 s_scratch[32];
    // the select's CTAs may be placed as this grid's CTAs leave (they cannot share an SM
    // with one: its registers are all taken); the select waits for its row's count
    // (row_ready), or else for this grid's end
    let_next_grid_start();
    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, lane = tid & 31, warp = wtid >> 5;
    const int g = lane >> 2, c = lane & 3;
    u64* kfull = reinterpret_cast<u64*>(smem + DenseSmem::kBars);  // ring stage j's unit landed
    u64* bfull = kfull + kStages;                                   // B buffer j's item staged
    u64* bempty = bfull + kBuffers;                                 // every MMA warpgroup done with it
    int* meta = reinterpret_cast<int*>(smem + DenseSmem::kMeta);
    int* start = reinterpret_cast<int*>(smem + DenseSmem::kStart);
    if (tid == 0) {
        for (int j = 0; j < kStages; ++j) mbar_init(kfull + j, 1);
        for (int j = 0; j < kBuffers; ++j) {
            mbar_init(bfull + j, 128);
            mbar_init(bempty + j, 128 * kMmaGroups);
        }
        mbar_init_fence();
    }
    for (int b = tid; b <= n_seq; b += kThreads) s_cu[b] = run_row(cu_seqlens, b, run_first, T);
    __syncthreads();
    if (tid == 0) {  // monotone offsets; s_items[b]: the items of the sequences before b
        s_items[0] = 0;
        for (int b = 0; b < n_seq; ++b) {
            s_cu[b + 1] = max(s_cu[b + 1], s_cu[b]);
            s_items[b + 1] = s_items[b] + (s_cu[b + 1] - s_cu[b] + kQueries - 1) / kQueries;
        }
    }
    __syncthreads();
    const int n_items = min(s_items[n_seq], kMaxItems);  // the launcher keeps it below kMaxItems
    // the item at zigzag position p: sequence, first row (in the run), rows (1 .. 4)
    struct Item {
        int b, first, rows;
    };
    auto item_at = [&](int p) {
        const int k = (p & 1) ? n_items - 1 - (p >> 1) : (p >> 1);
        const int b = item_of_tile(s_items, n_seq, k);
        const int first = s_cu[b] + kQueries * (k - s_items[b]);
        return Item{b, first, min(kQueries, s_cu[b + 1] - first)};
    };
    auto units_of = [&](int p) {
        const Item it = item_at(p);
        int m = 0;
        for (int i = 0; i < it.rows; ++i) m = max(m, visible_len(valid_lens, it.first + i, max_len));
        return (m + kSub - 1) / kSub;
    };
    const int work = (int)tile_starts<kMaxItems, kThreads>(n_items, units_of, start, s_scratch);
    const int u0 = (int)((long long)work * blockIdx.x / gridDim.x);
    const int u1 = (int)((long long)work * (blockIdx.x + 1) / gridDim.x);
    // launched under dense_keys_kernel's tail (programmatic dependent launch): the schedule
    // above reads only the call's inputs; the key image is that kernel's. Waited for before
    // any exit too: a grid whose CTAs all left first could end before its predecessor
    wait_for_previous_grid();
    if (u0 >= u1) return;  // the same in every thread
    const int p_first = item_of_tile(start, n_items, u0);
    // Where unit u's image lies, for units asked for in increasing order: a cursor on the
    // item holding the last one asked for (a search a unit measured ~10% of the kernel: the
    // issuing warp held its warpgroup back at the next barrier).
    struct UnitCursor {
        int p, b;
    };
    auto unit_src = [&](int u, UnitCursor& at) {
        if (start[at.p + 1] <= u) {
            do ++at.p; while (start[at.p + 1] <= u);
            at.b = item_at(at.p).b;
        }
        return kimg + ((long long)at.b * J + (u - start[at.p])) * kImg;
    };
    // unit u into ring stage (u - u0) % kStages, by one thread
    auto issue = [&](int u, UnitCursor& at) {
        const int st = (u - u0) % kStages;
        const unsigned char* src = unit_src(u, at);
        mbar_arrive_expect_tx(kfull + st, (u32)kImg);
        bulk_copy_g2s(smem + DenseSmem::kRing + st * kImg, src, (u32)kImg, kfull + st);
    };
    UnitCursor cursor{p_first, item_at(p_first).b};
    if (tid == 0)
        for (int u = u0; u < u1 && u < u0 + kStages; ++u) issue(u, cursor);
    // my share's items with units in it, in order: il counts them (B buffer il % kBuffers)
    auto has_units = [&](int p) { return min(start[p + 1], u1) > max(start[p], u0); };

    if (wg == 0) {  // ---- staging: each item's queries into B buffer il % kBuffers
        // the next item's rows, asked of L2 while this one's are staged: their loads then
        // wait on L2, not on HBM (prefill-8K scoring -4%; two items ahead measured +1%)
        int ahead = p_first;  // the next item to prefetch
        auto prefetch_next = [&]() {
            for (; ahead < n_items && start[ahead] < u1; ++ahead)
                if (has_units(ahead)) {
                    const Item it = item_at(ahead++);
                    const u32 bytes = (u32)(it.rows * H * kDim * sizeof(QT));
                    bulk_prefetch_l2(q + (long long)it.first * H * kDim, bytes);
                    return;
                }
        };
        if (wtid == 0) prefetch_next();
        int il = 0;
        for (int p = p_first; p < n_items && start[p] < u1; ++p) {
            if (!has_units(p)) continue;
            if (wtid == 0) prefetch_next();
            const int buf = il % kBuffers;
            if (il >= kBuffers) mbar_wait(bempty + buf, (u32)((il - kBuffers) / kBuffers) & 1u);
            const Item it = item_at(p);
            unsigned char* qb = smem + DenseSmem::kB + buf * kBBytes;
            float* wsm = reinterpret_cast<float*>(smem + DenseSmem::kW) + buf * kN;
            // one query at a time: two in flight measured no faster (and spill)
#pragma unroll 1
            for (int qq = 0; qq < it.rows; ++qq) {
                QueryStaging<kDim> staging;
                staging.load(q, w, H, it.first + qq);
                staging.template store_chunked<true>(qb + qq * (64 / 8) * 128, wsm + 64 * qq, kBLbo);  // weights in lane order
            }
            if (wtid < 4) {  // rows past the item's end (and lane 3's with three queries): length 0
                meta[buf * 8 + wtid] = wtid < it.rows ? visible_len(valid_lens, it.first + wtid, max_len) : 0;
                meta[buf * 8 + 4 + wtid] = it.first + min(wtid, it.rows - 1);
            }
            fence_proxy_async();  // the stores above, before the MMAs' reads
            mbar_arrive(bfull + buf);
            ++il;
        }
        return;
    }

    // ---- MMA warpgroups: warpgroup 1 + m takes the share's units u with (u - u0) % kMmaGroups == m
    const int m = wg - 1;
    const int next = m + 1 == kMmaGroups ? 0 : m + 1;  // the warpgroup whose turn follows mine
    const int r0 = 16 * warp + g;  // my first entry of a unit
    float acc[kN / 2];
    // turns: the units' MMAs are issued in unit order, warpgroup after warpgroup. Needed
    // for the ring's phases: the warpgroup waiting for unit u + 4 has had its turn for unit
    // u + 1, which follows the wait for unit u by unit u's warpgroup. Without the turns the
    // warpgroups drift apart, a wait for unit u + 4 can find the stage's earlier phase (unit
    // u) not yet complete and pass at once (same parity two phases on): v35's build
    // without them failed launches under load. (With two warpgroups, unit u + 4 was the
    // same warpgroup's; the turns were worth 1.6% there.)
    if (m == kMmaGroups - 1) asm volatile("bar.arrive %0, 256;" ::"r"(kTurnBarrier) : "memory");
    int il = 0;
    for (int p = p_first; p < n_items && start[p] < u1; ++p) {
        if (!has_units(p)) continue;
        const int buf = il % kBuffers;
        // waited for even without a unit here, so that this warpgroup's release of the buffer
        // below cannot count towards an earlier item's
        mbar_wait(bfull + buf, (u32)(il / kBuffers) & 1u);
        const int lo = max(start[p], u0), hi = min(start[p + 1], u1);
        // lane c stores query c's scores (see the epilogue): its length and score row
        const int my_len = meta[buf * 8 + c];
        float* my_out = scores + (long long)meta[buf * 8 + 4 + c] * ld;
        // the MMA descriptors by their low words (address, leading offset; the high word,
        // the 128-byte stride, is fixed; the K steps' offsets never carry out of the address
        // field), broadcast from lane 0 in the unit loop: warp-uniform, so the compiler builds
        // the eight MMAs' descriptors in uniform registers. Per-thread 64-bit adds and moves
        // to uniform registers took 133 instructions a unit a warp from the ring wait to the
        // MMA wait, now 85 (prefill-8K scoring -5 us, v36).
        const u32 desc_b_lo = (u32)wgmma_desc(smem + DenseSmem::kB + buf * kBBytes, kBLbo, 128);
        const float* wsm = reinterpret_cast<const float*>(smem + DenseSmem::kW) + buf * kN;
        for (int u = lo + (m - (lo - u0) % kMmaGroups + kMmaGroups) % kMmaGroups; u < hi; u += kMmaGroups) {
            const int st = (u - u0) % kStages;
            mbar_wait(kfull + st, (u32)((u - u0) / kStages) & 1u);
            const unsigned char* stage = smem + DenseSmem::kRing + st * kImg;
            const float g0 = reinterpret_cast<const float*>(stage + kImgA)[r0];
            const float g1 = reinterpret_cast<const float*>(stage + kImgA)[r0 + 8];
            const u32 desc_a = __shfl_sync(FULL_MASK, (u32)wgmma_desc(stage, kALbo, 128), 0);
            const u32 desc_b = __shfl_sync(FULL_MASK, desc_b_lo, 0);
            named_barrier(kTurnBarrier + m, 256);  // my turn
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < kDim / 16; ++ks) {
                const u64 da = wgmma_desc_of(desc_a + (u32)((2 * ks * kALbo) >> 4), 128);
                const u64 db = wgmma_desc_of(desc_b + (u32)((2 * ks * kBLbo) >> 4), 128);
                DenseMma<kN>::run(acc, da, db, ks > 0);
            }
            wgmma_commit();
            asm volatile("bar.arrive %0, 256;" ::"r"(kTurnBarrier + next) : "memory");  // the next one's turn
            wgmma_wait<0>();
            fence_accumulators(acc);
            // every thread's MMAs have read the stage: refill it with my unit four ahead
            named_barrier(1 + m, 128);
            if (wtid == 0 && u + kStages < u1) issue(u + kStages, cursor);
            // each lane's weighted head sums of rows r0, r0 + 8 for the item's queries, then
            // the quad's sums scattered so that lane c holds query c's: lanes c, c ^ 1
            // first (the parity of c keeps queries of that parity), then c, c ^ 2: the
            // association of weighted_head_sum_mine, so the sums are its bits, in half the
            // shuffles and with no lane idle at the stores
            float2 part[4];  // a fourth query of zeros where an item has three (its lane stores nothing)
            part[3] = make_float2(0.0f, 0.0f);
#pragma unroll
            for (int qq = 0; qq < kQueries; ++qq) {
                LaneWeights wq;  // query qq's weights of my heads: four 16-byte loads (lane_order_weight)
#pragma unroll
                for (int i = 0; i < 4; ++i) wq.v[i] = reinterpret_cast<const float4*>(wsm + 64 * qq + 4 * c)[4 * i];
                part[qq] = weighted_head_partials(reinterpret_cast<const float(&)[32]>(acc[32 * qq]), wq);
            }
            const bool odd = c & 1, upper = c & 2;
            float2 pair[2];  // queries odd and 2 + odd, summed over lanes c, c ^ 1
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float2 keep = odd ? part[2 * i + 1] : part[2 * i], give = odd ? part[2 * i] : part[2 * i + 1];
                pair[i] = make_float2(keep.x + __shfl_xor_sync(FULL_MASK, give.x, 1),
                                      keep.y + __shfl_xor_sync(FULL_MASK, give.y, 1));
            }
            const float2 keep = upper ? pair[1] : pair[0], give = upper ? pair[0] : pair[1];
            const float sum0 = keep.x + __shfl_xor_sync(FULL_MASK, give.x, 2);  // rows r0, r0 + 8
            const float sum8 = keep.y + __shfl_xor_sync(FULL_MASK, give.y, 2);
            const int s0 = (u - start[p]) * kSub + r0;
            // predicated stores, no branches (score_ks.cu's epilogue, docs/performance.md v50)
            store_global_if(my_out + s0, sum0 * g0 + 0.0f, s0 < my_len);  // -0 folded into +0
            store_global_if(my_out + s0 + 8, sum8 * g1 + 0.0f, s0 + 8 < my_len);
        }
        mbar_arrive(bempty + buf);  // my reads of the buffer's queries and weights are done
        ++il;
    }
    // every arrival at my turn barrier matched: the warpgroup whose turn would follow the
    // share's last unit has one turn left over
    if ((u1 - u0) % kMmaGroups == m) named_barrier(kTurnBarrier + m, 256);
    if (row_ready == nullptr) return;
    // Every MMA warpgroup's stores done (this barrier), then the share's rows counted for the
    // row select: thread t of the three warpgroups takes row t % kQueries of the share's
    // items t / kQueries + 128 j, adds the number of its scores this CTA stored (the item's
    // units in the share), each add after a fence of its own (a fence and a relaxed add:
    // the release pattern). Once a CTA, at its end: an item's rows are complete only at its last unit,
    // and a row select cannot be placed on this SM before this CTA leaves anyway (per item,
    // a release each warpgroup cost the call more than the early start gained: v55).
    named_barrier(kEndBarrier, 128 * kMmaGroups);
    // a stride over the share's items: a share can span more than 128 (the items of empty
    // rows, which have no units, lie between its own: a causal sequence of 4,096 rows beside
    // 3,000 padding rows spans 171, tests/test_cuda_row_ready.py)
    const int i = (tid - 128) % kQueries;
    for (int p = p_first + (tid - 128) / kQueries; p < n_items && start[p] < u1; p += 128 * kMmaGroups / kQueries) {
        const int lo = max(start[p], u0), hi = min(start[p + 1], u1);  // the item's units here
        if (hi <= lo) continue;
        const Item it = item_at(p);
        if (i >= it.rows) continue;
        const int row = it.first + i;
        const int len = visible_len(valid_lens, row, max_len);
        const int stored = min(max(len - (lo - start[p]) * kSub, 0), (hi - lo) * kSub);
        if (stored > 0) {
            __threadfence();
            red_relaxed_add(row_ready + row, (u32)stored);
        }
    }
}
