#!/usr/bin/env python3
"""Where the single-query kernel's tile loop spends its time, in place: copies of
kernels/score_wgmma.cu with one part of `score_segment`'s loop taken out or cut down,
written to a folder as whole sources for `scripts/ab_kernels.py --against FILE`, which
times each against the working tree's in one process (graph replays, rounds alternated).

    python exp/ablate_wgmma.py --out /tmp/ablate            # writes the variants, no GPU
    python exp/ablate_wgmma.py --out /tmp/ablate --run decode-1M,decode-128K

The variants' answers are wrong by design (ab_kernels prints ANSWERS DIFFER, or "bit for
bit" where a variant that stores nothing leaves main's scores in the reused memory); only
their scoring-alone times mean anything (a variant without its stores leaves the select
whatever the workspace held: its whole-call times are noise). Every part kept still feeds
something stored or counted, so that ptxas drops nothing else:

  no_store       the score's store behind a test no score passes (a NaN bit pattern no
                 arithmetic makes)
  no_count       the histogram's shared atomic behind the same test
  no_store_count both: the loop without any of the select's work
  fma_only       each head's ReLU left out: w * x, one FP32-pipe instruction a (head, entry)
                 where the kept form takes two (x + |x| or max.NaN, then the FMA)
  relu_alu       every head's ReLU as max.NaN (ALU pipe) then the FMA: the form before v64
                 (since v109 the kept form takes it for half the heads, kFmaReluGroups)
  half_heads     the epilogue over half the heads (32 of 64): half its FP32 work
  (these three stand-ins take the weights as given: since v109 half of them halved, so
  their answers differ more; their times are what they measure)
  no_epilogue    the head sums replaced by an XOR of the accumulators' bits (ALU pipe,
                 ~11 three-input logic ops a sub-tile): the epilogue's FP32 work gone
  no_decode      the FP4 decode replaced by an AND (and a shift) a fragment register (the
                 codes and scales still read from the stage)
  mma_loop       no_decode + no_epilogue + no_store_count: the ring, the MMAs and the loop
  no_mma         the MMAs left out: each accumulator a fragment register's bits (the
                 decode, the epilogue and the select's work kept: the CUDA-core stream alone)
  mma_first      not an ablation: a candidate change (answers bit for bit). A __syncwarp()
                 after sub-tile 0's MMAs, so that ptxas issues all eight of them before
                 sub-tile 1's decode; it issues three, then the decode, then thirteen back to
                 back (docs/performance.md v107). Same instructions (+1 NOP), registers, spills.
                 v108: slower (+0.7% decode-1M; the pair form +3.3% mtp-2), dropped
  pair_mma_first the same after the pair kernel's mma(0)
  pair_no_mma, pair_mma_loop, pair_no_mma_l2, pair_mma_loop_l2
                 the same in the pair kernel (score_pair_segment: mtp-2, prefill-8K)
  l2_keys, no_mma_l2, mma_loop_l2
                 main, no_mma and mma_loop with every block id taken modulo 64, so that the
                 keys come from 64 blocks that stay in L2 (the key stream off HBM; every
                 kernel that reads keys through BulkRing, here the single-query one timed)

  no_barrier     main without the stage barrier a tile (keys.end_reads): a warp may refill a
                 stage another still reads (answers may differ): what the barrier costs at most
  mma_loop_l2_no_barrier
                 the same in mma_loop_l2
  no_copy, no_mma_no_copy, mma_loop_no_copy, mma_loop_no_copy_no_barrier
                 every block id loaded, then taken as -1: no key copy is issued, each stage's
                 barrier completes on its runs' arrivals alone, the stages keep what they held
                 (the copies' and their waits' share, where the _l2 forms leave L2's); the
                 global-scale load is skipped too (scale_of(-1)): v108 found that ~2.5%
  no_copy_zeroed, no_copy_hashed, mma_loop_no_copy_zeroed, mma_loop_no_copy_hashed
                 the no_copy forms with the stages written at each segment's start: zeros, or a
                 fixed hash (every nibble at most 7): what the stages' contents do to the time
  const_gscale, filled_once_const_gscale, mma_loop_filled_once_const_gscale
                 every block's global scale taken as 1 (no key_gscale load): what the
                 refill's global-scale load, which waits on the block id's, costs
  gscale_ahead
                 not an ablation: a candidate. BulkRing's block ids and global scales
                 prefetched a tile deeper (a tile's global scale loaded two iterations before
                 its store, its block id three), so that the dependent global-scale load has
                 two tile times to land, not one. v108: +0.6..+2.2% (a spill), dropped
  gscale_select  not an ablation: a candidate. BulkRing::scale_of's load unconditional (block 0's
                 for b < 0; P >= 1 on every call) and then a select: the refill's branch region
                 around the load gone (census: BRA, BSSY, BSYNC -1 each; VIMNMX, FSEL +1; IMAD -1).
                 v109: level alone (-0.2..+0.5%); beside v109's branchless block id the pair
                 kernel's form (kScaleSelect, kept: mtp-2 -0.8%), in the single-query kernel a
                 spill in the tile loop, +0.4..+0.9% (this variant puts it there)
  l2_ahead
                 not an ablation: a candidate. Each refill also asks L2 for the next tile's
                 runs (cp.async.bulk.prefetch.L2), so that its copies, issued an iteration
                 later, find the keys in L2 (the ring is 4 tiles deep, no deeper at 3 CTAs an SM).
                 v108: +2.4..+7.4%, dropped
  filled_once, no_mma_filled_once, mma_loop_filled_once
                 a segment's first tiles copied, its later refills arrivals only: each stage
                 keeps a real tile's keys (no_copy's stages hold whatever was there before)

The variants are written with their headers inlined (the L2 ones change BulkRing's block
ids, in wgmma_common.cuh). A variant made only of such whole-text changes to BulkRing
(l2_keys, no_copy, filled_once, const_gscale, gscale_ahead, gscale_select, l2_ahead) changes
both kernels alike: timed on mtp-2 it measures the pair kernel (v108's "pair_l2_keys" was
l2_keys so timed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "kernels" / "score_wgmma.cu"

# each kernel's segment (template line, function name, the text after it): a variant's
# substitutions apply inside one of them only
SEGMENTS = {
    "single": ("template <int kDim, bool kStagedRows>", "__device__ __forceinline__ void score_segment(",
               "// Two schedules, one kernel:"),
    "pair": ("template <int kDim, bool kStagedQueries, int kForm, class QT>",
             "__device__ __forceinline__ void score_pair_segment(",
             "// grid (G,), 128 threads: CTA i takes a share of all pairs' tiles"),
}

_NEVER = "__float_as_uint(score) == 0x7f800001u"  # a signalling-NaN pattern arithmetic never makes
_STORE = "store_global(out + s, score);"
_COUNT = "atomicAdd(&hist_s[s < n && score == score ? raw_bin_of_plus_zero(score) : (u32)kHistBins], 1u);"
_SUM0 = "weighted_head_sum_mine_of<kFmaReluGroups>(acc[0], weights, c)"
_SUM1 = "weighted_head_sum_mine_of<kFmaReluGroups>(acc[1], weights, c)"
_DECODE = "decode_sub_tile<kDim>(st, u * kSubTile + 16 * warp + g, c, a_frag[u]);"
_MMA = "mma_sub_tile<kDim>(acc[u], a_frag[u], desc_q);"
# BulkRing::block_of's load (wgmma_common.cuh), inlined
_BLOCK = "const int b = bt[s >> e_shift];\n        return (b >= 0 && b < P) ? b : -1;"
# ... and BulkRing::issuer_block_of's, the tile loop's refill's (v109)
_ISSUER_BLOCK = "const int b = bt[mine ? s >> e_shift : 0];\n        return (mine && b >= 0 && b < P) ? b : -1;"
# ("whole", old, new): a substitution in the whole text (the inlined headers), not a segment
_L2 = [("whole", _BLOCK, "const int b = bt[s >> e_shift] & 63;\n        return (b >= 0 && b < P) ? b : -1;"),
       ("whole", _ISSUER_BLOCK,
        "const int b = bt[mine ? s >> e_shift : 0] & 63;\n        return (mine && b >= 0 && b < P) ? b : -1;")]
# every block id loaded, then taken as -1 (no valid id is below -2^30): no copy is issued,
# each run's stage barrier completes on its arrival alone, the stages keep what they held
_NO_COPY = [("whole", _BLOCK, "const int b = bt[s >> e_shift];\n        return b < -(1 << 30) ? b : -1;"),
            ("whole", _ISSUER_BLOCK,
             "const int b = bt[mine ? s >> e_shift : 0];\n        return (mine && b < -(1 << 30)) ? b : -1;")]

# helpers put before the segment: each variant's stand-in for a part
_HELPERS = r"""
// ---- ablation stand-ins (exp/ablate_wgmma.py) ----
template <int kForm, typename Weights>  // 0: w * x; 1: max.NaN then FMA; 2: half the heads
__device__ __forceinline__ float ablate_sum(const float (&d)[32], Weights weights, int c) {
    float lo0 = 0.0f, lo1 = 0.0f, hi0 = 0.0f, hi1 = 0.0f;
    auto r = [](float x) { return kForm == 1 ? relu_nan(x) : kForm == 2 ? twice_relu_nan(x) : x; };
    constexpr int kJ = kForm == 2 ? score_wgmma::kHeads / 16 : score_wgmma::kHeads / 8;
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
        const float2 wv = weights(j);
        lo0 = fmaf(wv.x, r(d[4 * j]), lo0);
        lo1 = fmaf(wv.y, r(d[4 * j + 1]), lo1);
        hi0 = fmaf(wv.x, r(d[4 * j + 2]), hi0);
        hi1 = fmaf(wv.y, r(d[4 * j + 3]), hi1);
    }
    const bool odd = c & 1;
    float mine = odd ? hi0 + hi1 : lo0 + lo1;
    mine += __shfl_xor_sync(FULL_MASK, odd ? lo0 + lo1 : hi0 + hi1, 1);
    mine += __shfl_xor_sync(FULL_MASK, mine, 2);
    return mine;
}

__device__ __forceinline__ float ablate_xor(const float (&d)[32]) {
    u32 x = 0u;
#pragma unroll
    for (int i = 0; i < 32; ++i) x ^= __float_as_uint(d[i]);
    return __uint_as_float(x & 0x3fffffffu);  // finite, so the count's bin stays in range
}

template <int kDim>
__device__ __forceinline__ void ablate_decode(const unsigned char* st, int r0, int c, u32 (&a)[kDim / 16][4]) {
    constexpr int kWords = kDim / 32;
    u32 raw0[kWords], sc0[kWords], raw1[kWords], sc1[kWords];
    read_stage_row<kDim>(st, r0, c, raw0, sc0);
    read_stage_row<kDim>(st, r0 + 8, c, raw1, sc1);
#pragma unroll
    for (int wd = 0; wd < kWords; ++wd) {
        a[2 * wd][0] = raw0[wd] & 0x37773777u; a[2 * wd][1] = raw1[wd] & 0x37773777u;
        a[2 * wd][2] = (raw0[wd] >> 4) & 0x37773777u; a[2 * wd][3] = (raw1[wd] >> 4) & 0x37773777u;
        a[2 * wd + 1][0] = sc0[wd] & 0x37773777u; a[2 * wd + 1][1] = sc1[wd] & 0x37773777u;
        a[2 * wd + 1][2] = (sc0[wd] >> 4) & 0x37773777u; a[2 * wd + 1][3] = (sc1[wd] >> 4) & 0x37773777u;
    }
}
template <int kDim>
__device__ __forceinline__ void ablate_mma(float (&acc)[32], const u32 (&a)[kDim / 16][4]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = __uint_as_float(a[i / 4][i % 4] & 0xbfffffffu);  // finite
}

// the pair kernel's k-step ks of an m64nN MMA (N = 8 x the accumulators' count): its eighth
// of the accumulators from the fragment's bits
template <int kAcc>
__device__ __forceinline__ void ablate_mma_pair(float (&acc)[kAcc], const u32 (&a)[4], int ks) {
#pragma unroll
    for (int i = 0; i < kAcc / 8; ++i) acc[ks * (kAcc / 8) + i] = __uint_as_float(a[i % 4] & 0xbfffffffu);
}
// ---- end of stand-ins ----

"""

_NO_STORE = [(_STORE, f"if ({_NEVER}) {_STORE}")]
_NO_COUNT = [(_COUNT, f"if ({_NEVER}) {_COUNT}")]
_NO_EPILOGUE = [(_SUM0, "ablate_xor(acc[0])"), (_SUM1, "ablate_xor(acc[1])")]
_NO_DECODE = [(_DECODE, "ablate_decode<kDim>(st, u * kSubTile + 16 * warp + g, c, a_frag[u]);")]

_P_MMA = [("wgmma_m64n64k16(acc, a_frag[u][ks], desc, ks > 0);", "ablate_mma_pair(acc, a_frag[u][ks], ks);"),
          ("wgmma_m64n128k16(acc, a_frag[u][ks], desc, ks > 0);", "ablate_mma_pair(acc, a_frag[u][ks], ks);")]
_P_LOOP = [(_DECODE, "ablate_decode<kDim>(st, u * kSubTile + 16 * warp + g, c, a_frag[u]);"),
           ("weighted_head_sum_mine<kFmaReluGroups>(half(0), w0, c)", "ablate_xor(half(0))"),
           ("weighted_head_sum_mine<kFmaReluGroups>(half(1), w1, c)", "ablate_xor(half(1))"),
           ("my_out[s] = score;", f"if ({_NEVER}) my_out[s] = score;"),
           ("count_raw_bin_packed(my_hist, score, s < my_count_n && score == score);",
            f"if ({_NEVER}) count_raw_bin_packed(my_hist, score, s < my_count_n && score == score);")]

_NO_MMA = [(_MMA, "ablate_mma<kDim>(acc[u], a_frag[u]);")]
_MMA_LOOP = _NO_DECODE + _NO_EPILOGUE + _NO_STORE + _NO_COUNT
_NO_BARRIER = [("        keys.end_reads();\n", "")]
# the tile loop's refills as arrivals only (BulkRing::refill_after_mma, inlined): a segment's
# first tiles are copied, then each stage keeps its first tile's keys for the rest
# tile it + kS's runs asked of L2 in iteration it, one iteration before their copies
# (BulkRing::refill_after_mma and a prefetch_runs beside issue_runs, inlined)
_PREFETCH_RUNS = r"""    __device__ void prefetch_runs(int j, int tid, int b) {
        const int rows = 1 << row_shift;
        const u32 code_bytes = rows * kCodeBytes, scale_bytes = rows * kScaleBytes;
        const int tile_start = (first_tile + j) * score_wgmma::kTile;
        const int warp = __shfl_sync(~0u, tid >> 5, 0);
        const bool leader = elect_one();
        auto one_run = [&](int i) {
            const int bi = __shfl_sync(~0u, b, i);
            const int r = ((warp - rot) & 3) + 4 * i;
            if (leader && r < copies && bi >= 0) {
                const long long ent = (long long)bi * E + ((tile_start + (r << row_shift)) & (E - 1));
                bulk_prefetch_l2(keys_fp4 + ent * kCodeBytes, code_bytes);
                bulk_prefetch_l2(key_scale + ent * kScaleBytes, scale_bytes);
            }
        };
        one_run(0);
        for (int i = 1; 4 * i < copies; ++i) one_run(i);
    }
"""
_ISSUE = "    __device__ void issue(int j, int tid, int b, float g) { issue_runs<true, true>(j, tid, b, g); }\n"
_L2_AHEAD = [("whole", _ISSUE, _PREFETCH_RUNS + _ISSUE),
             ("whole", "        b_next = b_next2;\n        g_next = scale_of(b_next);\n",
              "        b_next = b_next2;\n        if (it + kS < num_tiles) prefetch_runs(it + kS, tid, b_next);\n"
              "        g_next = scale_of(b_next);\n")]
# the ring's stages written at each segment's start (with _NO_COPY: nothing else writes
# them): zeros, or a fixed hash of each word, every nibble at most 7 (finite codes and
# scales), so that the MMAs' operands are known
def _fill_stages(word: str):
    return [("    keys.store_start_scales(tid, g_first);\n",
             "    for (int i = tid; i < BulkRing<kDim>::kS * BulkRing<kDim>::kStageBytes / 4; i += kThreads)\n"
             f"        reinterpret_cast<u32*>(keys.ring)[i] = {word};\n"
             "    keys.store_start_scales(tid, g_first);\n")]


_ZEROED = _fill_stages("0u")
_HASHED = _fill_stages("((u32)i * 2654435761u ^ ((u32)i >> 7) * 40503u) & 0x77777777u")
# every run's global scale 1 (no load of key_gscale; -1 blocks still NaN): what the refill's
# dependent global-scale load (issued an iteration before its store) costs
# (both of BulkRing::scale_of's forms: the single-query kernel's, the pair kernel's)
_SCALE_OF = "            return b >= 0 ? key_gscale[b] : __int_as_float(0x7fc00000);\n"
_SCALE_SELECT = "            const float g = key_gscale[b >= 0 ? b : 0];\n"
_CONST_GSCALE = [("whole", _SCALE_OF, _SCALE_OF.replace("key_gscale[b]", "1.0f")),
                 ("whole", _SCALE_SELECT, "            const float g = 1.0f;\n")]
# a candidate: each tile's global scale loaded two iterations before its store, not one
# (its block id three before, not two): BulkRing's prefetch one tile deeper
_GSCALE_AHEAD = [
    ("whole", "    int b_next2, b_next;  // prefetched block ids (tiles it + kS, it + kS - 1 ... see advance)\n    float g_next;\n",
     "    int b_next3, b_next2, b_next;  // prefetched block ids (tiles it + kS + 1, it + kS, it + kS - 1)\n"
     "    float g_next2, g_next;\n"),
    ("whole", "        b_next = issuer(tid) ? block_of(kS - 1, tid) : -1;\n        b_next2 = issuer(tid) ? block_of(kS, tid) : -1;\n"
              "        g_next = scale_of(b_next);\n",
     "        b_next = issuer(tid) ? block_of(kS - 1, tid) : -1;\n        b_next2 = issuer(tid) ? block_of(kS, tid) : -1;\n"
     "        b_next3 = issuer(tid) ? block_of(kS + 1, tid) : -1;\n"
     "        g_next = scale_of(b_next);\n        g_next2 = scale_of(b_next2);\n"),
    ("whole", "        b_next2 = issuer(tid) ? block_of(kS, tid) : -1;\n    }\n",
     "        b_next2 = issuer(tid) ? block_of(kS, tid) : -1;\n        b_next3 = issuer(tid) ? block_of(kS + 1, tid) : -1;\n    }\n"),
    ("whole", "g_first[j] = scale_of(b_first[j]);\n        g_next = scale_of(b_next);\n",
     "g_first[j] = scale_of(b_first[j]);\n        g_next = scale_of(b_next);\n        g_next2 = scale_of(b_next2);\n"),
    ("whole", "        b_next = b_next2;\n        g_next = scale_of(b_next);\n        b_next2 = issuer_block_of(it + kS + 1, tid);\n",
     "        b_next = b_next2;\n        g_next = g_next2;\n        b_next2 = b_next3;\n        g_next2 = scale_of(b_next2);\n"
     "        b_next3 = issuer_block_of(it + kS + 2, tid);\n"),
]
# the pair kernel's form of the global scale's load in the single-query kernel too: loaded
# unconditionally (block 0's for b < 0) and then selected (BulkRing's kScaleSelect)
_GSCALE_SELECT = ("whole", "    BulkRing<kDim> keys;\n", "    BulkRing<kDim, score_wgmma::kStages, true> keys;\n")
_FILLED_ONCE = ("whole", "if (it + kS - 1 < num_tiles) issue(it + kS - 1, tid, b_next, g_next);",
                "if (it + kS - 1 < num_tiles) issue(it + kS - 1, tid, -1, g_next);")

#: name: substitutions; names starting "pair" apply to the pair kernel's segment
VARIANTS = {
    "no_store": _NO_STORE,
    "no_count": _NO_COUNT,
    "no_store_count": _NO_STORE + _NO_COUNT,
    "fma_only": [(_SUM0, "ablate_sum<0>(acc[0], weights, c)"), (_SUM1, "ablate_sum<0>(acc[1], weights, c)")],
    "relu_alu": [(_SUM0, "ablate_sum<1>(acc[0], weights, c)"), (_SUM1, "ablate_sum<1>(acc[1], weights, c)")],
    "half_heads": [(_SUM0, "ablate_sum<2>(acc[0], weights, c)"), (_SUM1, "ablate_sum<2>(acc[1], weights, c)")],
    "no_epilogue": _NO_EPILOGUE,
    "no_decode": _NO_DECODE,
    "no_mma": _NO_MMA,
    "mma_loop": _MMA_LOOP,
    "mma_first": [(f"            {_MMA}\n", f"            {_MMA}\n            if (u == 0) __syncwarp();\n")],
    "l2_keys": _L2,
    "no_mma_l2": _NO_MMA + _L2,
    "mma_loop_l2": _MMA_LOOP + _L2,
    "no_barrier": _NO_BARRIER,
    "mma_loop_l2_no_barrier": _MMA_LOOP + _L2 + _NO_BARRIER,
    "no_copy": _NO_COPY,
    "no_mma_no_copy": _NO_MMA + _NO_COPY,
    "mma_loop_no_copy": _MMA_LOOP + _NO_COPY,
    "mma_loop_no_copy_no_barrier": _MMA_LOOP + _NO_COPY + _NO_BARRIER,
    "filled_once": [_FILLED_ONCE],
    "no_mma_filled_once": _NO_MMA + [_FILLED_ONCE],
    "mma_loop_filled_once": _MMA_LOOP + [_FILLED_ONCE],
    "l2_ahead": _L2_AHEAD,
    "no_copy_zeroed": _NO_COPY + _ZEROED,
    "no_copy_hashed": _NO_COPY + _HASHED,
    "mma_loop_no_copy_zeroed": _MMA_LOOP + _NO_COPY + _ZEROED,
    "mma_loop_no_copy_hashed": _MMA_LOOP + _NO_COPY + _HASHED,
    "const_gscale": _CONST_GSCALE,
    "filled_once_const_gscale": [_FILLED_ONCE] + _CONST_GSCALE,
    "mma_loop_filled_once_const_gscale": _MMA_LOOP + [_FILLED_ONCE] + _CONST_GSCALE,
    "gscale_ahead": _GSCALE_AHEAD,
    "gscale_select": [_GSCALE_SELECT],
    "pair_mma_first": [("        mma(0);\n        if (second) decode(st, 1);",
                        "        mma(0);\n        __syncwarp();\n        if (second) decode(st, 1);")],
    "pair_no_mma": _P_MMA,
    "pair_mma_loop": _P_LOOP,
    "pair_no_mma_l2": _P_MMA + _L2,
    "pair_mma_loop_l2": _P_LOOP + _L2,
}


def variant_text(text: str, subs, kernel: str = "single") -> str:
    """``text`` (score_wgmma.cu, headers inlined) with each (old, new) of ``subs`` applied
    once inside ``kernel``'s segment (SEGMENTS; ("whole", old, new) once in the whole text),
    and the stand-ins put before the single-query segment. Raises ValueError where an old
    string is not found exactly once (the kernel changed: mend the strings above)."""
    for sub in subs:  # whole-text substitutions (the inlined headers)
        if sub[0] == "whole":
            if text.count(sub[1]) != 1:
                raise ValueError(f"{sub[1]!r} found {text.count(sub[1])} times (expected once)")
            text = text.replace(sub[1], sub[2])
    subs = [sub for sub in subs if sub[0] != "whole"]
    template, name, after = SEGMENTS[kernel]
    begin = text.rindex(template, 0, text.index(name))
    end = text.index(after, begin)
    segment = text[begin:end]
    for old, new in subs:
        if segment.count(old) != 1:
            raise ValueError(f"{old!r} found {segment.count(old)} times in {name} (expected once)")
        segment = segment.replace(old, new)
    text = text[:begin] + segment + text[end:]
    first = text.rindex(SEGMENTS["single"][0], 0, text.index(SEGMENTS["single"][1]))
    return text[:first] + _HELPERS + text[first:]


def write_variants(out: Path, names=None) -> list[Path]:
    sys.path.insert(0, str(ROOT))
    from indexer import _jit  # noqa: PLC0415

    text = _jit._inline(SOURCE, {SOURCE})
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names or VARIANTS:
        path = out / f"score_wgmma_{name}.cu"
        path.write_text(variant_text(text, VARIANTS[name], "pair" if name.startswith("pair") else "single"))
        paths.append(path)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the variants' sources")
    ap.add_argument("--variants", help=f"comma-separated subset of: {', '.join(VARIANTS)}")
    ap.add_argument("--run", help="comma-separated bench cases to time them on (needs a GPU)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    names = args.variants.split(",") if args.variants else None
    if names and (bad := [n for n in names if n not in VARIANTS]):
        ap.error(f"--variants: unknown {bad}")
    paths = write_variants(Path(args.out), names)
    for p in paths:
        print(p)
    if args.run:
        for case in args.run.split(","):
            cmd = [sys.executable, str(ROOT / "scripts" / "ab_kernels.py"), "--source", "score_wgmma.cu",
                   "--case", case, "--rounds", str(args.rounds)]
            for p in paths:
                cmd += ["--against", str(p)]
            sys.stdout.flush()
            subprocess.run(cmd, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
