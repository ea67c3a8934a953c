"""Launch geometry: pure functions from problem shapes and device facts to grid, block,
shared memory and template arguments. No CUDA here, so every choice is unit-tested on CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["Device", "H200", "ScoreLaunch", "score_fp32_launch", "fp32_smem_bytes", "mma_smem_bytes", "score_mma_launch", "score_wgmma_launch",
           "wgmma_supported", "wgmma_smem_bytes", "wgmma_query_image_bytes", "wgmma_pairs_smem_bytes", "score_wgmma_pairs_launch", "pairs_preferred", "PAIRS_MIN_WORK", "PAIRS_SPLIT_MIN_WORK", "pairs_pay", "pairs_split", "SPLIT_MAX_ROWS_PER_SEQ", "ws_supported", "ws_preferred", "WS_MAX_WORK", "WS_MIN_ROW_ENTRIES", "ws_smem_bytes", "score_ws_launch", "ks_supported", "ks_preferred", "ks_smem_bytes", "score_ks_launch", "dense_supported", "dense_preferred", "dense_smem_bytes", "dense_units", "dense_image_bytes", "score_dense_launch", "DENSE_MAX_ROWS", "DENSE_MAX_SEQS", "DENSE_UNIT_BYTES", "DENSE_MAX_IMAGE_BYTES", "DENSE_MIN_WORK", "KS_GROUP", "KS_QUERY_BYTES", "KS_MIN_ROWS", "KS_MIN_LEN", "KS_MAX_SEQS", "select_fast_chunks", "select_fast_per_thread", "MAX_BALANCED_ROWS", "MAX_PAIR_ROWS",
           "workspace_rows", "workspace_row_bytes", "DEFAULT_WORKSPACE_BYTES", "DEFAULT_RAGGED_WORKSPACE_BYTES", "ROW_SELECT_MAX_LEN", "ROW_SELECT_LONG_ROWS_PER_SM", "row_select_preferred", "SAMPLED_MAX_K", "SAMPLED_MAX_LEN", "SAMPLED_STREAM_MAX_LEN", "sampled_streams", "sampled_threshold_fits", "SHORT_ROW_SELECT_MAX_LEN", "SHORT_ROW_SELECT_MAX_K", "SHORT_ROW_SELECT_HALF_K", "row_select_kernel", "TILE_ENTRIES", "CANDIDATE_CAP", "RANK_MAX", "RANK_GROUP", "RANK_ALL_PAIRS_ROWS", "RANK_ALL_PAIRS_WORK", "rank_all_pairs", "rank_all_pairs_ctas_per_row", "rank_ctas_per_row", "rank_select", "ROW_STREAM_THREADS", "ROW_STREAM_SMEM", "row_stream_select", "SELECT_CHUNK", "HIST_BINS"]

#: entries per score tile (kernels/score_fp32.cu: kTileEntries)
TILE_ENTRIES = 128
#: per-row candidate buffer of the multi-CTA select (kernels/select_fast.cu: kCap)
CANDIDATE_CAP = 8192
#: rows with at most this many candidates are ranked by topk_rank_kernel, RANK_GROUP per CTA
#: (kernels/select_fast.cu: kRankMax; RANK_GROUP is its 256 threads, one candidate each);
#: a row with more is selected from its scores by its first rank CTA (the one-CTA radix
#: select), so runs that rank launch no sort kernel
RANK_MAX = 4096
RANK_GROUP = 256


def rank_select(rows: int, top_k: int, dev: "Device | None" = None) -> bool:
    """Whether a run's candidates are ranked (topk_rank_kernel: several CTAs per row, each
    candidate compared within its fine key bin, or with every other candidate of its row
    for the fewest rows: rank_all_pairs) rather than sorted (one CTA per row): when
    a grid of a thread for each of 2 x top_k candidates a row fits in two waves
    (RANK_CTAS_PER_SM CTAs an SM). Measured on the H200 (graph, whole
    call, rank vs sort): decode-ragged (64 rows, k = 1024) 0.458 vs 0.478 ms, decode-E256
    0.216 vs 0.221, prefill-chunk 41.36 vs 42.18, mtp-2 (128 rows, k = 1024) 0.365 vs
    0.364, decode-128K (128 rows, k = 512) 0.225 vs 0.222; decode-1M's runs of 32 rows rank
    in 7.5-8 us against ~31 for a sort. Asked only of runs that row_stream_select leaves
    to the filter (mtp-2's and decode-128K's 128 rows now stream, v57)."""
    return rows * _rank_group_ctas(top_k) <= 2 * RANK_CTAS_PER_SM * (dev or H200).sm_count


#: runs of one row, or of at most RANK_ALL_PAIRS_ROWS rows with rows x top_k at most
#: RANK_ALL_PAIRS_WORK, rank by comparing every pair of a row's candidates
#: (kernels/select_fast.cu: topk_rank_kernel<256, true>), the SMs' worth of CTAs shared out.
#: Measured on an H100 (whole calls, graph, docs/performance.md v104; all-pairs against fine
#: bins, us): at k = 1,024 over 262,144 entries 1 row 25.0 / 26.1, 2 rows level (37.3 /
#: 37.0), 3 rows 47.2 / 46.7, 4 rows 59.7 / 56.6 (65,536 entries: 27.5 / 26.0), 5 to 8 rows
#: 10-23% slower all-pairs; at k = 512 over 32,768 entries 3 rows 15.6 / 16.2, 4 rows 18.2 /
#: 18.6, over 65,536 entries 6 rows 32.3 / 31.6, 8 rows 38.1 / 36.7; at k = 256 8 rows 24.7
#: / 25.1, 16 rows 37.4 / 36.8; at k = 2,048 1 row level (26.7 / 26.8), 2 rows 41.2 / 37.9.
#: A row's compares grow as its candidates squared (~1.5 x top_k of them at these k) and its
#: CTAs fall as 1 / rows. Up to eight rows at a small k (v105, H100, one process, answers
#: bit for bit; all-pairs against fine bins, us): 6 rows of 262,144 at k = 128 71.4 / 72.2,
#: 8 rows of 65,536 at k = 128 35.6 / 36.4, 8 rows of 262,144 at k = 64 92.1 / 92.5, at k =
#: 256 level (92.5 / 92.6); 16 rows of 262,144 at k = 64 169.8 / 170.6. More than eight rows
#: at rows x top_k <= 2,048 (a row's candidates there set by the width of the k-th key's
#: histogram bin rather than by k) are barely timed, so the rows bound stays.
RANK_ALL_PAIRS_ROWS = 8
RANK_ALL_PAIRS_WORK = 2048


def rank_all_pairs(rows: int, top_k: int) -> bool:
    """Whether a ranked run compares every pair of a row's candidates (cnt^2 compares a row,
    spread over every SM; no shared-memory layout by key bins first) rather than ranking
    within fine key bins (G = rank_ctas_per_row CTAs a row): for one row, or for up to
    RANK_ALL_PAIRS_ROWS rows with rows x top_k <= RANK_ALL_PAIRS_WORK, where the bins' three
    barrier-separated phases are the row's critical path and most of the GPU would idle.
    Batch 1 (decode-latency, ~1,500 candidates a row): see docs/performance.md v25."""
    return rows == 1 or (rows <= RANK_ALL_PAIRS_ROWS and rows * top_k <= RANK_ALL_PAIRS_WORK)


def rank_all_pairs_ctas_per_row(rows: int, dev: "Device | None" = None) -> int:
    """CTAs per row of the all-pairs rank: the SMs shared out among the run's rows (one
    CTA a row where there are more rows than SMs)."""
    return max(1, (dev or H200).sm_count // max(1, rows))


#: CTAs of topk_rank_kernel an SM (kernels/select_fast.cu: its __launch_bounds__)
RANK_CTAS_PER_SM = 4


def _rank_group_ctas(top_k: int) -> int:
    """CTAs a row that give 2 x top_k candidates one thread each (the usual count is 1-2 x
    top_k), at most RANK_MAX / RANK_GROUP."""
    return max(1, min(RANK_MAX // RANK_GROUP, -(-2 * top_k // RANK_GROUP)))


def rank_ctas_per_row(top_k: int, rows: int = 1, dev: "Device | None" = None) -> int:
    """CTAs per row of topk_rank_kernel (fine key bins) for a run of ``rows`` rows: a
    candidate a thread for 2 x top_k candidates, or half as many CTAs (two a thread) where
    that grid would not fit one wave of RANK_CTAS_PER_SM CTAs an SM. Every CTA lays out the
    row's candidates whole before ranking its share, so a second wave repeats that layout
    for little ranking: mtp-2's shape (128 rows, k = 1,024, before it streamed: v57) ranked
    in 8.7 us with 4 CTAs a row against 11.3 with 8 (ncu; graph -2.5 us); the one-wave runs
    (64 rows at k = 1,024, 128 at 512) measured within noise or slower at half
    (docs/performance.md v56). More candidates than the CTAs' threads are taken in turns."""
    ctas = _rank_group_ctas(top_k)
    if rows * ctas > RANK_CTAS_PER_SM * (dev or H200).sm_count:
        ctas = max(1, ctas // 2)
    return ctas


#: threads of topk_row_stream_kernel (kernels/select_fast.cu), one CTA a row, and its
#: dynamic shared memory (row_stream_smem: four 32 KB chunks of the row in flight); its
#: static shared memory is the RANK_MAX candidates' 8 bytes each, the counts of the
#: ranking's RANK_BINS fine key bins and ~1 KB more
ROW_STREAM_THREADS = 1024
ROW_STREAM_SMEM = 4 * 8 * ROW_STREAM_THREADS * 4
#: fine key bins of a row's candidates in the ranking (kernels/select_fast.cu: kRankBins)
RANK_BINS = 1024


def row_stream_select(rows: int, top_k: int, dev: "Device | None" = None) -> bool:
    """Whether a run with a histogram selects each row in one CTA that streams the row's
    scores, gathers the entries at or above its threshold bin in shared memory and ranks
    them there (topk_row_stream_kernel), rather than by the filter's CTAs a 4,096-entry
    chunk and a ranking or sorting kernel after them: for runs of at least three rows
    for every four SMs (one CTA an SM, so fewer would leave the stream to part of the GPU:
    64 rows measured slower, docs/performance.md v57), top_k <= RANK_MAX / 4 (a row's
    candidates, ~1-2 x top_k, fit the CTA's RANK_MAX slots), and the CTA's shared memory
    within the device's."""
    dev = dev or H200
    fits = ROW_STREAM_SMEM + 8 * RANK_MAX + 4 * RANK_BINS + 2048 <= dev.max_smem_per_block
    return 4 * rows >= 3 * dev.sm_count and 4 * top_k <= RANK_MAX and fits


#: entries one CTA of the histogram and filter kernels covers (256 threads x 16)
SELECT_CHUNK = 4096
HIST_BINS = 2048
_CHUNK = 32  # dimensions decoded per stage (kChunk)
_MMA_STAGES = 4  # shared-memory ring depth of score_mma.cu (kStages)


@dataclass(frozen=True)
class Device:
    """The device facts geometry needs."""

    sm_count: int
    max_smem_per_block: int  # opt-in limit, bytes
    compute_capability: int


#: the H200 as seen here (132 SMs, 227 KB opt-in shared memory per block)
H200 = Device(sm_count=132, max_smem_per_block=232448, compute_capability=90)


@dataclass(frozen=True)
class ScoreLaunch:
    name: str              # kernel name expression
    grid: tuple            # (T, chunks per row)
    block: tuple
    smem: int              # dynamic shared memory, bytes
    tiles_per_cta: int
    ld: int                # workspace row stride in floats (a multiple of TILE_ENTRIES)
    balanced: bool = False  # grid (G,): the CTAs share all rows' tiles (wgmma kernels: shares claimed, ShareClaims)


def head_groups(H: int) -> int:
    """Groups of 8 heads, rounded up to a power of two (1..16)."""
    g = 1
    while 8 * g < H:
        g *= 2
    if g > 16:
        raise ValueError(f"q: at most 128 heads are supported, got H = {H}")
    return g


def tiles_per_row(max_len: int) -> int:
    return max(1, -(-max_len // TILE_ENTRIES))


@functools.lru_cache(maxsize=256)  # pure; a call asks for it on every launch
def score_fp32_launch(T: int, H: int, D: int, max_len: int, dev: Device = H200,
                      ctas_per_sm: int = 8) -> ScoreLaunch:
    """Geometry of ``score_fp32_kernel``: one CTA per (query, run of tiles).

    Runs of tiles are long enough to amortise staging the query (H x D floats) and short
    enough that T * chunks CTAs give every SM ``ctas_per_sm`` of them: a single long row
    (decode at batch 1) still spreads over the whole chip.
    """
    hg = head_groups(H)
    tiles = tiles_per_row(max_len)
    per_cta, chunks = _tile_runs(T, tiles, dev.sm_count * ctas_per_sm)
    smem = fp32_smem_bytes(D, hg)
    if smem > dev.max_smem_per_block:
        raise ValueError(f"q: H = {H}, D = {D} needs {smem} bytes of shared memory, the device has {dev.max_smem_per_block}")
    return ScoreLaunch(name=f"score_fp32_kernel<{hg}>", grid=(T, chunks), block=(32 * hg,), smem=smem,
                       tiles_per_cta=per_cta, ld=tiles * TILE_ENTRIES)


def fp32_smem_bytes(D: int, head_groups: int = 8) -> int:
    """Shared memory of ``score_fp32_kernel<head_groups>`` at head dim D (kernels/score_fp32.cu:
    Fp32Smem): the query [D][8 * head_groups] and a decoded key chunk [32][128] as float32, the
    weights, the tile's global scales, its 128 entry offsets (int64) and the 256-pair E2M1 table."""
    hpad = 8 * head_groups
    return 4 * (D * hpad + _CHUNK * TILE_ENTRIES + hpad + TILE_ENTRIES) + 8 * (TILE_ENTRIES + 256)


def _tile_runs(T: int, tiles: int, target_ctas: int) -> tuple:
    """(tiles per CTA, CTAs per row) so that T rows give about ``target_ctas`` CTAs."""
    per_cta = max(1, min(tiles, (T * tiles) // target_ctas))
    return per_cta, -(-tiles // per_cta)


def mma_head_blocks(H: int) -> int:
    """8-head column blocks of the tensor-core kernel: even, a power of two, 2..16."""
    return max(2, head_groups(H))


def mma_smem_bytes(D: int, head_blocks: int = 8) -> int:
    """Shared memory of ``score_mma_kernel<D, head_blocks>`` (kernels/score_mma.cu: MmaSmem):
    the query rows [8 * head_blocks][D + 8] as 16-bit values, their weights, the key ring
    (fast_common.cuh: KeyRing, its stages and metadata slots) and the histogram."""
    stage = TILE_ENTRIES * (D // 2) + -(-(TILE_ENTRIES * (D // 16)) // 16) * 16
    heads = 8 * head_blocks
    return (heads * (D + 8) * 2 + heads * 4 + _MMA_STAGES * stage + (_MMA_STAGES + 1) * TILE_ENTRIES * 8
            + HIST_BINS * 4)


@functools.lru_cache(maxsize=256)  # pure; a call asks for it on every launch
def score_mma_launch(T: int, H: int, D: int, max_len: int, dev: Device = H200,
                     ctas_per_sm: int = 3) -> ScoreLaunch:
    """Geometry of ``score_mma_kernel``: 4 warps, 128 entries per CTA iteration, one CTA per
    (query, run of tiles).

    ``ctas_per_sm`` CTAs fit on an SM at once (registers and shared memory). With T rows at
    most that many in total, each row is cut into as many runs as fill one wave exactly, so
    a batch of 64 or 128 rows, or one long row, keeps every SM busy without a ragged second
    wave; with more rows, runs are sized for about eight waves.
    """
    nb = mma_head_blocks(H)
    tiles = tiles_per_row(max_len)
    resident = dev.sm_count * ctas_per_sm
    runs = max(1, resident // T) if T <= resident else max(1, round(8 * resident / T))
    per_cta = -(-tiles // min(runs, tiles))
    chunks = -(-tiles // per_cta)
    smem = mma_smem_bytes(D, nb)
    if smem > dev.max_smem_per_block:
        raise ValueError(f"q: H = {H}, D = {D} needs {smem} bytes of shared memory, the device has {dev.max_smem_per_block}")
    return ScoreLaunch(name=f"score_mma_kernel<{D}, {nb}>", grid=(T, chunks), block=(128,), smem=smem,
                       tiles_per_cta=per_cta, ld=tiles * TILE_ENTRIES)


#: rows the balanced schedule of the wgmma kernel holds (kernels/score_wgmma.cu: kMaxBalancedRows)
MAX_BALANCED_ROWS = 1024
_WGMMA_STAGES = 4  # kernels/score_wgmma.cu: kStages


def wgmma_supported(H: int, D: int, dev: Device = H200, E: int = 64) -> bool:
    """The warpgroup-MMA kernel covers Hopper (sm_90a), up to 64 heads, D up to 128, and
    pools whose block size E is a power of two with E * D/16 a multiple of 16 (its keys
    arrive by bulk copies of whole block runs, 16-byte multiples)."""
    return (dev.compute_capability == 90 and H <= 64 and D <= 128 and E > 0 and E & (E - 1) == 0
            and (E * (D // 16)) % 16 == 0)


def _ring_stage_bytes(D: int) -> int:
    """Bytes of one key stage of the wgmma kernels' rings (kernels/wgmma_common.cuh:
    wgmma_stage_bytes): a tile's codes, then its scales, 128-byte aligned."""
    return -(-(TILE_ENTRIES * (D // 2) + TILE_ENTRIES * (D // 16)) // 128) * 128


def wgmma_smem_bytes(D: int) -> int:
    """Shared memory of ``score_wgmma_kernel<D>`` (kernels/score_wgmma.cu: WgmmaSmem; the
    ring's barriers and the query image's, and the histogram's HIST_BINS counts followed by
    16 bytes for its spare bin)."""
    stage = _ring_stage_bytes(D)
    return (wgmma_query_image_bytes(D) + _WGMMA_STAGES * stage + _WGMMA_STAGES * TILE_ENTRIES * 4
            + (_WGMMA_STAGES + 1) * 8 + HIST_BINS * 4 + 16 + (MAX_BALANCED_ROWS + 1) * 4 + 32 * 4 + 16)


def wgmma_query_image_bytes(D: int) -> int:
    """Bytes of one query's image for ``score_wgmma_kernel<D>`` (kernels/score_wgmma.cu:
    PrepToWgmmaImage, written by ``wgmma_prep_kernel<D>``): its B operand in the core-matrix
    layout, then its 64 weights (half of them halved: score_wgmma::fma_relu_head); one bulk
    copy brings it into shared memory."""
    return (D // 8) * 1024 + 64 * 4


@functools.lru_cache(maxsize=256)  # pure; a call asks for it on every launch
def score_wgmma_launch(T: int, H: int, D: int, max_len: int, dev: Device = H200,
                       ctas_per_sm: int = 3, E: int = 64) -> ScoreLaunch:
    """Geometry of ``score_wgmma_kernel``: one warpgroup, 128 entries per CTA iteration
    (two wgmma sub-tiles of 64), the query in wgmma's core-matrix layout.

    Up to ``MAX_BALANCED_ROWS`` rows, one wave of CTAs (``ctas_per_sm`` per SM) shares the
    tiles of all rows, whatever their lengths (found on the device, no host sync), each CTA
    claiming a share sized by its slot on its SM (kernels/wgmma_common.cuh: ShareClaims):
    a ragged batch costs its total length, not its longest row times the batch. Beyond
    that, runs of tiles per row as for ``score_mma_launch``.
    """
    if not wgmma_supported(H, D, dev, E):
        raise ValueError(f"q: the wgmma kernel needs sm_90, H <= 64, D <= 128 and a power-of-two E with "
                         f"E * D/16 a multiple of 16, got H = {H}, D = {D}, E = {E}")
    smem = wgmma_smem_bytes(D)
    name = f"score_wgmma_kernel<{D}>"
    ld = tiles_per_row(max_len) * TILE_ENTRIES
    if T <= MAX_BALANCED_ROWS:
        return ScoreLaunch(name=name, grid=(dev.sm_count * ctas_per_sm, 1), block=(128,), smem=smem,
                           tiles_per_cta=0, ld=ld, balanced=True)
    base = score_mma_launch(T, 64, D, max_len, dev, ctas_per_sm)
    return ScoreLaunch(name=name, grid=base.grid, block=(128,), smem=smem, tiles_per_cta=base.tiles_per_cta,
                       ld=ld)


_KS_WARPGROUPS = 3  # kernels/score_ks.cu: score_ks::kWarpgroups
_KS_SLOTS = 4  # its query ring (score_ks::kSlots)
#: bytes of one query's image for the keys-stationary kernel (KsSmem::kQImage: B, its 64
#: weights, the row's visible length padded to 16 bytes)
KS_QUERY_BYTES = (128 // 8) * 1024 + 64 * 4 + 16
#: entries one CTA of the keys-stationary kernel holds (score_ks::kGroup)
KS_GROUP = _KS_WARPGROUPS * TILE_ENTRIES


def ks_supported(H: int, D: int, dev: Device = H200, E: int = 64) -> bool:
    """The keys-stationary kernel (kernels/score_ks.cu) covers what the wgmma kernel does at
    D = 128 (two rows of scales a 16-byte piece)."""
    return D == 128 and wgmma_supported(H, D, dev, E)


#: the keys-stationary kernel is the default for rows of one sequence from this many rows,
#: over at least this many entries and twice as many entries as rows (a chunk after a
#: prefix: every row sees most of the pool). Measured (v30, whole calls, graph): 16 rows
#: over 65,536 entries 57.6 against 63.8 us in pairs, 64 over 2,048 29.9 / 37.5, 512 over
#: 2,176 79.5 / 80.6, prefill-chunk 33.9 / 38.2 ms; 8 rows tie (40.4 / 41.4). Causal rows
#: from the pool's start (max_len = T / 4 at 4:1) stay in pairs, whose schedule follows each
#: row's length: 2,048 rows 120 against 84 us, prefill-8K 764 / 558 us.
KS_MIN_ROWS = 16
KS_MIN_LEN = 2048
#: sequences one launch of the keys-stationary kernel takes (kernels/score_ks.cu: kMaxSeqs).
#: Batched chunks (v31, whole calls, graph, ks against pairs): 4 sequences of 512 rows over
#: 65,536 entries 4.24 / 4.82 ms, 8 of 256 over 16,384 1.29 / 1.41 ms, 2 of 2,048 over
#: 131,072 17.2 / 19.2 ms, 16 of 64 over 8,192 0.41 / 0.43 ms.
KS_MAX_SEQS = 256


def ks_preferred(T: int, H: int, D: int, max_len: int, dev: Device = H200, E: int = 64, seqs: int = 1) -> bool:
    """Whether ``fast_kernel='auto'`` scores the T rows of ``seqs`` sequences with the
    keys-stationary kernel (docs/performance.md, v30): as many rows a sequence, on average,
    as the rule asks of one sequence."""
    per_seq = T // max(seqs, 1)
    return (1 <= seqs <= KS_MAX_SEQS and per_seq >= KS_MIN_ROWS and max_len >= max(KS_MIN_LEN, 2 * per_seq)
            and ks_supported(H, D, dev, E))


def ks_smem_bytes(D: int = 128) -> int:
    """Shared memory of ``score_ks_kernel<D>`` (kernels/score_ks.cu: KsSmem): the query
    ring's slots (a query image, its barrier and count, padded to 128-byte lines), one key
    stage a warpgroup."""
    stage = _ring_stage_bytes(D)
    return _KS_SLOTS * ((D // 8) * 1024 + 64 * 4 + 128) + _KS_WARPGROUPS * stage


def score_ks_launch(T: int, H: int, D: int, max_len: int, dev: Device = H200, E: int = 64) -> ScoreLaunch:
    """Geometry of ``score_ks_kernel``: one CTA an SM, each taking an equal share of the
    run's (key group, row) items, which the kernel counts from the rows' visible lengths."""
    if not ks_supported(H, D, dev, E):
        raise ValueError(f"q: the keys-stationary kernel needs sm_90, H <= 64, D = 128 and a power-of-two E, "
                         f"got H = {H}, D = {D}, E = {E}")
    return ScoreLaunch(name=f"score_ks_kernel<{D}>", grid=(dev.sm_count, 1), block=(128 * _KS_WARPGROUPS,),
                       smem=ks_smem_bytes(D), tiles_per_cta=0, ld=tiles_per_row(max_len) * TILE_ENTRIES,
                       balanced=True)


#: rows of one run of the dense kernel (kernels/score_dense.cu: its schedule holds
#: ceil(DENSE_MAX_ROWS / 3) + DENSE_MAX_SEQS items of three rows)
DENSE_MAX_ROWS = 8192
#: sequences one launch of the dense kernel takes (score_dense::kMaxSeqs)
DENSE_MAX_SEQS = 256
#: bytes of one 64-entry unit of the dense kernel's fp16 key image (score_dense::kImg)
DENSE_UNIT_BYTES = 64 * 128 * 2 + 64 * 4
#: the largest key image the dense kernel is chosen for by default: every unit is read
#: once for each item of three rows that sees it, so the image should stay in L2 (50 MB)
DENSE_MAX_IMAGE_BYTES = 16 << 20
_DENSE_MAX_ITEMS = 2988  # score_dense::kMaxItems: ceil(DENSE_MAX_ROWS / 3) + DENSE_MAX_SEQS + 1
_DENSE_STAGES = 4  # score_dense::kStages
_DENSE_QUERIES = 3  # score_dense::kQueries: rows an item
_DENSE_BUFFERS = 3  # score_dense::kBuffers
#: threads of a score_dense_kernel CTA (score_dense::kThreads): the staging warpgroup and three MMA warpgroups
DENSE_THREADS = 512


def dense_supported(H: int, D: int, dev: Device = H200, E: int = 64) -> bool:
    """The dense kernel (kernels/score_dense.cu) takes Hopper (sm_90a), up to 64 heads,
    D = 128 and a power-of-two E."""
    return dev.compute_capability == 90 and H <= 64 and D == 128 and E > 0 and E & (E - 1) == 0


def dense_units(max_len: int) -> int:
    """64-entry units of one sequence's key image (its block table's L * E entries)."""
    return max(1, -(-max_len // 64))


def dense_image_bytes(seqs: int, max_len: int) -> int:
    """Workspace bytes of the dense kernel's fp16 key image for ``seqs`` sequences."""
    return seqs * dense_units(max_len) * DENSE_UNIT_BYTES


#: the dense kernel is the default from this many (row, entry) pairs a call (T x max_len),
#: with at least a quarter as many rows a sequence as entries: below either its fixed costs
#: (the key image's launch, each CTA's schedule and first staging, ~10 us) or its image's
#: L2 traffic (every unit read again by each item of rows) lose to the pair and
#: keys-stationary kernels. Measured (v33, whole calls, graph, dense against the kernel
#: taken before): 8,192 causal rows over 2,048 entries 424 / 483 us (pairs), 6,144 over
#: 1,536 287 / 317, 4,096 over 2,048 232 / 251, 4,096 over 1,024 171 / 176, 2,048 rows
#: over 4,096 144 / 224 (keys-stationary); before the epilogue's last cut: 2,048 over 512
#: 85 / 77 (pairs), 512 full rows over 2,176 69.8 / 69.6, 64 over 2,048 32.6 / 24.3 (ks).
DENSE_MIN_WORK = 1 << 22


def dense_preferred(T: int, H: int, D: int, max_len: int, dev: Device = H200, E: int = 64, seqs: int = 1) -> bool:
    """Whether ``fast_kernel='auto'`` scores the T rows of ``seqs`` sequences with the dense
    kernel: many rows a sequence (16 or more, and at least max_len / 4, on average), much
    work (T x max_len at least DENSE_MIN_WORK) and a key image small enough to stay in L2
    (DENSE_MAX_IMAGE_BYTES)."""
    per_seq = T // max(seqs, 1)
    return (1 <= seqs <= DENSE_MAX_SEQS and per_seq >= 16 and 4 * per_seq >= max_len and T * max_len >= DENSE_MIN_WORK
            and dense_image_bytes(seqs, max_len) <= DENSE_MAX_IMAGE_BYTES and dense_supported(H, D, dev, E))


def dense_smem_bytes(D: int = 128) -> int:
    """Dynamic shared memory of ``score_dense_kernel<D>`` (kernels/score_dense.cu: DenseSmem):
    three B buffers of three queries and their weights, the key ring, barriers, the rows'
    lengths and the schedule's item starts."""
    n = 64 * _DENSE_QUERIES
    b_lbo = (n // 8) * 128 + 32  # score_dense::kBLbo: K chunks 32 bytes off a multiple of 128 (bank-conflict-free staging)
    return (_DENSE_BUFFERS * (D // 8) * b_lbo + _DENSE_BUFFERS * n * 4 + _DENSE_STAGES * DENSE_UNIT_BYTES
            + (_DENSE_STAGES + 2 * _DENSE_BUFFERS) * 8 + _DENSE_BUFFERS * 8 * 4 + (_DENSE_MAX_ITEMS + 1) * 4)


def score_dense_launch(T: int, H: int, D: int, max_len: int, dev: Device = H200, E: int = 64) -> ScoreLaunch:
    """Geometry of ``score_dense_kernel``: one CTA an SM, each an equal share of the run's
    (item of three rows, 64-entry unit) work."""
    if not dense_supported(H, D, dev, E):
        raise ValueError(f"q: the dense kernel needs sm_90, H <= 64, D = 128 and a power-of-two E, "
                         f"got H = {H}, D = {D}, E = {E}")
    if T > DENSE_MAX_ROWS:
        raise ValueError(f"q: the dense kernel takes at most {DENSE_MAX_ROWS} rows a run, got {T}")
    return ScoreLaunch(name=f"score_dense_kernel<{D}>", grid=(dev.sm_count, 1), block=(DENSE_THREADS,),
                       smem=dense_smem_bytes(D), tiles_per_cta=0, ld=tiles_per_row(max_len) * TILE_ENTRIES,
                       balanced=True)


_PAIR_STAGES = 3  # kernels/score_wgmma.cu: score_wgmma_pairs::kStages
#: rows of one run of the pair kernel (kernels/score_wgmma.cu: score_wgmma_pairs::kMaxRows):
#: prefill's 8,192 rows in one run (where the budget holds their scores), so that short and
#: long causal rows share the SMs and the launches are paid once
MAX_PAIR_ROWS = 8192
#: tile starts the pair kernel's schedule holds in shared memory (score_wgmma_pairs::kMaxUnits;
#: past that many row pairs, one start per group of pairs)
_PAIR_SCHEDULE_SLOTS = 1024


def wgmma_pairs_smem_bytes(D: int) -> int:
    """Shared memory of ``score_wgmma_pairs_kernel<D>`` (kernels/score_wgmma.cu: WgmmaPairSmem;
    the ring's barriers and the query images'; its last 16 bytes hold the share the CTA
    claimed last)."""
    stage = _ring_stage_bytes(D)
    return ((D // 8) * (2 * 1024 + 16) + 2 * 64 * 4 + _PAIR_STAGES * stage + _PAIR_STAGES * TILE_ENTRIES * 4
            + (_PAIR_STAGES + 1) * 8 + HIST_BINS * 4 + (_PAIR_SCHEDULE_SLOTS + 1) * 4 + 32 * 4 + MAX_PAIR_ROWS // 8 + 16)


@functools.lru_cache(maxsize=256)  # pure; a call asks for it on every launch
def score_wgmma_pairs_launch(T: int, H: int, D: int, max_len: int, dev: Device = H200, E: int = 64,
                             ctas_per_sm: int = 3) -> ScoreLaunch:
    """Geometry of ``score_wgmma_pairs_kernel``: row pairs of one sequence share each key
    tile (decoded once, multiplied against both queries); one wave of ``ctas_per_sm`` CTAs
    per SM shares all pairs' tiles. Up to ``MAX_PAIR_ROWS`` rows."""
    if not wgmma_supported(H, D, dev, E):
        raise ValueError(f"q: the wgmma kernels need sm_90, H <= 64, D <= 128 and a power-of-two E with "
                         f"E * D/16 a multiple of 16, got H = {H}, D = {D}, E = {E}")
    if T > MAX_PAIR_ROWS:
        raise ValueError(f"q: the pair kernel takes at most {MAX_PAIR_ROWS} rows a run, got {T}")
    return ScoreLaunch(name=f"score_wgmma_pairs_kernel<{D}>", grid=(dev.sm_count * ctas_per_sm, 1), block=(128,),
                       smem=wgmma_pairs_smem_bytes(D), tiles_per_cta=0,
                       ld=tiles_per_row(max_len) * TILE_ENTRIES, balanced=True)


#: rows a sequence on average up to which a pair call splits off its lone rows (pairs_split):
#: multi-token decode's few rows a request, where about every other row may be alone
SPLIT_MAX_ROWS_PER_SEQ = 8


def pairs_preferred(T: int, n_seq: int) -> bool:
    """Whether a grouped call of T rows in ``n_seq`` sequences takes the pair kernel (rows of
    a sequence in pairs sharing each key tile) over the single-query kernel: where it has
    more rows than sequences. One row a sequence (decode through ``score_topk_ragged``)
    shares nothing, and there the single-query kernel is the faster (H100, 64 rows of 65,536
    entries: 0.178 against 0.214 ms for every row alone in the pair kernel's split form,
    docs/performance.md v103). Decided from the shapes alone, as the offsets may be on the
    device: empty sequences count, so a batch padded with many empty ones (more sequences
    than rows) takes the single-query kernels even where some of its sequences hold
    several rows (the answers are the same contract's; only the sharing is lost). Under
    ``fast_kernel='auto'`` the call must also have work enough for the pair kernel
    (pairs_pay); a forced ``'wgmma'`` pairs by this rule alone."""
    return T > n_seq


#: grouped calls of fewer (row, entry) pairs than this (T x max_len, max_len the table's
#: capacity) score their rows alone under fast_kernel='auto' (pairs_pay) ...
PAIRS_MIN_WORK = 1 << 20
#: ... and calls that split off their lone rows (pairs_split) below this many
PAIRS_SPLIT_MIN_WORK = 1 << 22


def pairs_pay(T: int, max_len: int, n_seq: int) -> bool:
    """Whether a grouped call of T rows in ``n_seq`` sequences whose rows outnumber its
    sequences (pairs_preferred) has work enough for the pair kernel under
    ``fast_kernel='auto'``: at least PAIRS_MIN_WORK (row, entry) pairs (T x max_len, max_len
    the table's capacity L * E), or PAIRS_SPLIT_MIN_WORK where the call would split off its
    lone rows into a second launch (pairs_split). Below it the pair kernel's fixed costs
    (its staging kernel; the second launch's start and the first's tail) outweigh the key
    decodes it shares, and the rows go alone as a per-token call's would (the
    warp-specialised kernel for a few long rows, geometry.ws_preferred, else the
    single-query wgmma kernel). Measured on an H100 (whole calls, graph, one process;
    docs/performance.md v105), pairs against the rows alone, us: 1 request of 2 rows over
    262,144 entries 39.5 / 35.8, of 3 rows 53.7 / 45.6; 1 of 2 rows over 65,536 27.4 /
    18.4; 2 of 2 rows 31.3 / 25.4; 4 of 2 rows 40.2 / 37.0; 4 of 2 rows over 16,384 27.7 /
    18.6; at 2^20 level (2 of 2 rows over 262,144 55.8 / 55.9, 8 of 2 over 65,536 58.0 /
    58.3, 1 of 4 over 262,144 55.1 / 55.3); past it the pairs ahead (16 of 2 rows over
    65,536 90.0 / 97.7, 4 of 4 over 131,072 87.5 / 94.7). Split calls: 2 of 3 rows over 262,144 87.9 / 73.7, 2 of 3 over
    65,536 47.1 / 31.5, 8 of 3 89.8 / 76.1, 4 of 5 79.0 / 66.4, 20 of 3 (2^21.9) 173.2 /
    166.1; from 2^22 about level (32 of 3 over 65,536 252.9 / 249.7, 64 of 3 over 32,768
    263.9 / 263.6, 16 of 5 211.9 / 214.4), past 2^23 the pairs ahead (64 of 3 over 65,536,
    the bench's mtp-3: 477.1 / 485.6)."""
    return T * max_len >= (PAIRS_SPLIT_MIN_WORK if pairs_split(T, n_seq) else PAIRS_MIN_WORK)


def pairs_split(T: int, n_seq: int) -> bool:
    """Whether a pair-kernel call scores its lone rows (a row whose pair (2u, 2u + 1) spans
    two sequences, or the last of an odd T) in a second launch of their own
    (``score_wgmma_pairs_kernel<D, false, float, 2>``, m64n64 MMAs), the shared pairs in the
    first (``<D, false, float, 1>``), rather than in the pair's m64n128 form in one launch,
    where a lone row costs about what a pair does (its MMAs half wasted). Decided from the
    shapes alone (the offsets stay on the device): split where lone rows are expected many
    among few rows a sequence (multi-token decode: at most SPLIT_MAX_ROWS_PER_SEQ rows a
    sequence on average), unless the rows divide into sequences of an even count (mtp-2,
    mtp-4), or there is one sequence (at most one lone row). The second launch costs the
    first's tail and its own start (~10-20 us, docs/performance.md v103), which a few lone
    rows among many (a ragged prefill's) would not repay."""
    if n_seq < 2 or T > SPLIT_MAX_ROWS_PER_SEQ * n_seq:
        return False
    return not (T % n_seq == 0 and (T // n_seq) % 2 == 0)


def ws_supported(H: int, D: int, dev: Device = H200, E: int = 64) -> bool:
    """The warp-specialised kernel (kernels/score_ws.cu) covers what the wgmma kernel does,
    for D = 128 only (its decode and shared-memory layout are written for 4 chunks of 32
    dimensions per entry)."""
    return D == 128 and wgmma_supported(H, D, dev, E)


#: the warp-specialised kernel takes calls of several rows up to this many (row, entry)
#: pairs (T x max_len, max_len the table's capacity L * E) ...
WS_MAX_WORK = 1 << 18
#: ... where the table holds at least this many entries a row (max_len)
WS_MIN_ROW_ENTRIES = 4096


def ws_preferred(T: int, H: int, D: int, dev: Device = H200, E: int = 64, *, max_len: int = 0) -> bool:
    """Whether ``fast_kernel='auto'`` takes the warp-specialised kernel rather than the
    single-warpgroup one (``score_wgmma_kernel``): for a single row, where its two CTAs per
    SM spread one row's tiles over fewer, longer CTAs than the single-warpgroup kernel's
    three (decode-latency scoring, H200: 0.028-0.029 vs 0.032-0.033 ms), and for a few long
    rows (T x max_len <= WS_MAX_WORK, max_len >= WS_MIN_ROW_ENTRIES; max_len is the table's
    capacity L * E, 0 where unknown: one row only), where it stages each query itself (no
    staging kernel before it) and the call is mostly its fixed costs. Measured on an H100
    (whole calls, graph, against the wgmma kernel forced; docs/performance.md v104): 2 rows
    of 32,768 entries 0.0158 vs 0.0186 ms, 16 of 8,192 0.0199 vs 0.0228, 2 of 65,536 0.0184
    vs 0.0209, 8 of 32,768 0.0260 vs 0.0276, 2 of 131,072 0.0259 vs 0.0271, 64 of 4,096
    level; past the bound level at 3 x 2^17, then 2 of 262,144 0.0385 vs 0.0369, 64 of 8,192
    0.0447 vs 0.0419; on rows of 2,048 entries or fewer slower (128 of 2,048 0.0293 vs
    0.0283, 1,024 rows of 256 entries 0.0656 vs 0.0543). With many rows the single-warpgroup
    kernel is well ahead (64 rows of 262,144: 0.666 vs 0.798 ms)."""
    if not ws_supported(H, D, dev, E):
        return False
    return T == 1 or (max_len >= WS_MIN_ROW_ENTRIES and T * max_len <= WS_MAX_WORK)


_WS_DEC_STAGES = 2  # kernels/score_ws.cu: kDecStages
_WS_CTAS_PER_SM = 2  # its __launch_bounds__ (256 threads, 2 CTAs) and shared memory (~94 KB each)


def ws_smem_bytes(D: int = 128) -> int:
    """Shared memory of ``score_ws_kernel<D>`` (kernels/score_ws.cu: WsSmem)."""
    return (_WS_DEC_STAGES * (TILE_ENTRIES * D * 2 + TILE_ENTRIES * 4 + 2 * 8) + (D // 8) * (1024 + 32) + 64 * 4
            + HIST_BINS * 4 + (MAX_BALANCED_ROWS + 1) * 4 + MAX_BALANCED_ROWS * 4 + 32 * 4)


@functools.lru_cache(maxsize=256)  # pure; a call asks for it on every launch
def score_ws_launch(T: int, H: int, D: int, max_len: int, dev: Device = H200, E: int = 64) -> ScoreLaunch:
    """Geometry of ``score_ws_kernel``: CTAs of two warpgroups (a producer that decodes key
    tiles into shared memory, a consumer that runs the MMAs and the epilogue), two per SM,
    the balanced schedule over up to ``MAX_BALANCED_ROWS`` rows."""
    if not ws_supported(H, D, dev, E):
        raise ValueError(f"q: the warp-specialised kernel needs sm_90, H <= 64, D = 128 and a power-of-two E with "
                         f"E * D/16 a multiple of 16, got H = {H}, D = {D}, E = {E}")
    if T > MAX_BALANCED_ROWS:
        raise ValueError(f"q: the warp-specialised kernel takes at most {MAX_BALANCED_ROWS} rows a run, got {T}")
    smem = ws_smem_bytes(D)
    if smem > dev.max_smem_per_block:
        raise ValueError(f"q: the warp-specialised kernel needs {smem} bytes of shared memory, the device has "
                         f"{dev.max_smem_per_block}")
    return ScoreLaunch(name=f"score_ws_kernel<{D}>", grid=(dev.sm_count * _WS_CTAS_PER_SM, 1), block=(256,),
                       smem=smem, tiles_per_cta=0, ld=tiles_per_row(max_len) * TILE_ENTRIES, balanced=True)


def select_fast_per_thread(rows: int, ld: int, dev: Device = H200) -> int:
    """Entries per thread (256 threads a CTA) of the histogram and filter kernels: 16, or 4
    when a run has too few rows for 16 to give every SM two CTAs (a batch of one long row
    would otherwise read its 1 MB of scores with 64 CTAs)."""
    return 16 if rows * select_fast_chunks(ld, 16) >= 2 * dev.sm_count else 4


def select_fast_chunks(ld: int, per_thread: int = 16) -> int:
    """CTAs per row of the histogram and filter kernels."""
    return max(1, -(-ld // (256 * per_thread)))


#: the sampled threshold (kernels/select_fast.cu: topk_sample_kernel) aims at ~2 x k candidates
#: a row (at least 32 x ld / 8,192): it is taken where they fit the CANDIDATE_CAP buffer with
#: room, k up to SAMPLED_MAX_K over rows up to SAMPLED_MAX_LEN entries
SAMPLED_MAX_K = 2048
SAMPLED_MAX_LEN = 1 << 19


#: runs whose scoring kernel counts no histogram (keys-stationary) and whose rows would stream
#: their select (row_stream_select) take a histogram pass and the streamed select rather than
#: the sampled threshold where their rows hold up to this many entries (sampled_streams)
SAMPLED_STREAM_MAX_LEN = 1 << 16


def sampled_streams(rows: int, top_k: int, ld: int, dev: "Device | None" = None) -> bool:
    """Whether a run of ``rows`` rows of ``ld`` entries that would take the sampled threshold
    (its scoring kernel counts no histogram) takes a histogram pass and the streamed select
    instead (one pass over the scores and a CTA a row streaming them, against a sample
    kernel, the filter's pass, the candidates' round trip and a CTA a row sorting them):
    for rows of up to SAMPLED_STREAM_MAX_LEN entries, where row_stream_select would stream."""
    return ld <= SAMPLED_STREAM_MAX_LEN and row_stream_select(rows, top_k, dev)


def sampled_threshold_fits(top_k: int, ld: int) -> bool:
    """Whether rows of ``ld`` entries may take the sampled candidate threshold for ``top_k``
    (its expected candidates, max(2 k, 32 ld / 8,192), at most half the buffer)."""
    return top_k <= SAMPLED_MAX_K and ld <= SAMPLED_MAX_LEN


#: rows up to this many entries (workspace row length) may be selected by one CTA per row
#: straight from their scores (kernels/select_fast.cu: topk_row_kernel), not by the
#: multi-CTA histogram/filter/sort passes (row_select_preferred says where they are)
ROW_SELECT_MAX_LEN = 4096
#: rows up to this many entries, with top_k <= SHORT_ROW_SELECT_MAX_K, take the 128-thread row
#: select (16 entries a thread; eight CTAs a SM: more rows in flight, fewer warps a barrier)
SHORT_ROW_SELECT_MAX_LEN = 2048
SHORT_ROW_SELECT_MAX_K = 1024
#: ... of which k <= this takes an instance holding half the winners' slots (prefill-8K's
#: k = 512: its select 90.6 -> 87.8 us, v34)
SHORT_ROW_SELECT_HALF_K = 512


#: rows of more than SHORT_ROW_SELECT_MAX_LEN entries take the row select where there are
#: more than this many of them an SM (row_select_preferred)
ROW_SELECT_LONG_ROWS_PER_SM = 0.5


def row_select_preferred(T: int, ld: int, dev: "Device | None" = None) -> bool:
    """Whether ``select='auto'`` selects a call's T rows of ``ld`` entries (workspace row
    length) by one CTA a row (topk_row_kernel) rather than by the multi-CTA passes: rows of
    up to SHORT_ROW_SELECT_MAX_LEN entries always, rows of up to ROW_SELECT_MAX_LEN where
    there are more of them than half the SMs (ROW_SELECT_LONG_ROWS_PER_SM). Fewer such rows
    leave most SMs idle while each row's one CTA of 256 threads works through its 16
    entries a thread, where the multi-CTA passes spread a row over many CTAs. Measured on an
    H100 (whole calls, graph, one process, answers bit for bit; docs/performance.md v105),
    rows of 4,096 entries, one CTA a row against the multi-CTA passes, us: at k = 512 1 row
    15.7 / 11.8, 4 rows 16.4 / 12.8, 16 rows 18.4 / 15.3, 32 rows 22.9 / 21.1, 64 rows 30.0
    / 29.3, 128 rows level (42.3 / 42.2), 256 rows 66.2 / 69.5; at k = 1,024 16 rows 24.7 /
    16.6, 64 rows 36.4 / 33.2, 128 rows 48.1 / 56.9, 256 rows 73.0 / 83.0; the exact path at
    k = 1,024 1 row 35.2 / 27.2, 16 rows 81.4 / 74.8, 64 rows level (266.7 / 265.1). Rows
    of 512-2,048 entries are faster by one CTA a row at every count from 4 to 256 (by 5-21%;
    one row level)."""
    return ld <= ROW_SELECT_MAX_LEN and (ld <= SHORT_ROW_SELECT_MAX_LEN
                                         or T > ROW_SELECT_LONG_ROWS_PER_SM * (dev or H200).sm_count)


def row_select_kernel(ld: int, top_k: int, max_top_k: int) -> tuple[str, int]:
    """(instance name, threads) of ``topk_row_kernel`` for score rows of ``ld`` entries:
    128 threads for short rows and k <= SHORT_ROW_SELECT_MAX_K (with SHORT_ROW_SELECT_HALF_K
    winners' slots for k up to that), else 256 with every top-k up
    to ``max_top_k``; rows past ROW_SELECT_MAX_LEN (the row select forced) are read by every
    pass instead of held in registers."""
    if ld <= SHORT_ROW_SELECT_MAX_LEN and top_k <= SHORT_ROW_SELECT_MAX_K:
        max_k = SHORT_ROW_SELECT_HALF_K if top_k <= SHORT_ROW_SELECT_HALF_K else SHORT_ROW_SELECT_MAX_K
        return f"topk_row_kernel<128, {max_k}, {SHORT_ROW_SELECT_MAX_LEN // 128}>", 128
    regs = ROW_SELECT_MAX_LEN // 256 if ld <= ROW_SELECT_MAX_LEN else 0
    return f"topk_row_kernel<256, {max_top_k}, {regs}>", 256


#: default device workspace of one call: issue 4's bound on extra memory for decode
DEFAULT_WORKSPACE_BYTES = 64 << 20
#: default of the grouped calls (score_topk_ragged: prefill, multi-token decode), issue 5's
#: bound: prefill-chunk's 4,096 rows of 1 MB of scores run as 18 runs of 228 rows, not 74 (-3.4%, v28)
DEFAULT_RAGGED_WORKSPACE_BYTES = 256 << 20


def workspace_row_bytes(ld: int, query_bytes: int = 0, row_select: bool = False) -> int:
    """Workspace bytes per query row: the score row, ``query_bytes`` of staged query (the
    fast path's fp16 copy and scaled weights) and, for the multi-CTA select, the histogram,
    candidate count and candidate buffer (``row_select``: one CTA per row needs none of them)."""
    select = 0 if row_select else 4 * (HIST_BINS + 1) + 8 * CANDIDATE_CAP
    return 4 * ld + query_bytes + select


#: CUDA's limit on a grid's y dimension
MAX_GRID_Y = 65535


def workspace_rows(T: int, ld: int, budget_bytes: int = DEFAULT_WORKSPACE_BYTES, query_bytes: int = 0,
                   row_select: bool = False, max_rows: int | None = None) -> int:
    """Query rows per run: as many as fit the budget (at least one, at most MAX_GRID_Y: the
    select kernels put rows on a grid's y axis, and at most ``max_rows`` where a kernel
    takes no more), spread evenly over the runs so that no run is a small tail (each run
    pays the select's latency once)."""
    fit = max(1, min(T, MAX_GRID_Y, max_rows or MAX_GRID_Y,
                     budget_bytes // workspace_row_bytes(ld, query_bytes, row_select)))
    runs = -(-T // fit) if T else 1
    return max(1, -(-T // runs))
