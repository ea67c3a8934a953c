"""The CUDA backend of ``score_topk``: device arrays in, launches on the current CuPy stream.

Imported only when the GPU path is taken (it imports CuPy). With ``validate=False`` nothing
here synchronises with the host: shapes and dtypes are still checked (host metadata only),
and the kernels clamp lengths and skip out-of-range block ids, so no input can make them
read or write outside the arrays.
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np

from . import _jit, arrays, geometry, outbuf, streams, validate as _validate
from .launch import after_previous
from .workspace import turn_of

__all__ = ["score_topk", "device_facts"]


@functools.cache
def device_facts(device_id: int) -> geometry.Device:
    props = cp.cuda.runtime.getDeviceProperties(device_id)
    return geometry.Device(
        sm_count=int(props["multiProcessorCount"]),
        max_smem_per_block=int(props.get("sharedMemPerBlockOptin", props["sharedMemPerBlock"])),
        compute_capability=int(props["major"]) * 10 + int(props["minor"]),
    )


def check_device(dev, device_id):
    """RuntimeError, naming the backend, where GPU ``device_id`` (facts ``dev``) is older than
    the kernels run on (``arrays.MIN_COMPUTE_CAPABILITY``): said once, before any compile."""
    major, minor = arrays.MIN_COMPUTE_CAPABILITY
    cc = dev.compute_capability
    if cc < 10 * major + minor:
        name = cp.cuda.runtime.getDeviceProperties(device_id)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        raise RuntimeError(f"backend 'cuda': GPU {device_id} ({name}) has compute capability {cc // 10}.{cc % 10}, "
                           f"and the CUDA kernels need {major}.{minor} or newer (sm_80 and later); "
                           "backend='numpy' scores the arrays on the host (device arrays are copied there)")


def _kernel(source, launch_name, device_id, smem=0):
    kern = _jit.get_kernel(source, launch_name, device_id)
    if smem > 48 * 1024 and kern.max_dynamic_shared_size_bytes < smem:
        kern.max_dynamic_shared_size_bytes = smem
    return kern


def _check_alignment(name, x, nbytes):
    # the kernels copy key rows with 16-byte (codes) and 4-byte (scales) asynchronous copies
    if x.data.ptr % nbytes:
        raise ValueError(f"{name}: expected a {nbytes}-byte aligned device array (got an offset view)")


def score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k, *,
               precision="fast", return_scores=False, physical=False, validate=True,
               workspace_budget=None, out=None, workspace=None, stream=None,
               _score_only=False, _fast_kernel="auto", _select="auto", _cu_seqlens=None, _readers=()):
    """CUDA score + top-k; arguments as ``indexer.score_topk``. Returns CuPy arrays for device
    inputs (PyTorch tensors for PyTorch inputs), NumPy arrays when ``q`` came from the host,
    or ``out`` itself when given (filled through zero-copy CuPy views). ``workspace_budget``
    None: ``geometry.DEFAULT_WORKSPACE_BYTES``, or ``DEFAULT_RAGGED_WORKSPACE_BYTES`` for the
    grouped calls (``_cu_seqlens``); ``_readers``: (name, array) pairs of the grouped call's own
    arguments that ``out`` must not overlap either."""
    like = q
    names = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens")
    given = (q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens)
    arrays.check_kinds(names, given, in_order=True)
    # everything from the DLPack imports to the results runs on one stream: PyTorch's current
    # one for tensors (so a torch.cuda.graph capture records it), or the one asked for
    # and the workspace's turn: calls sharing it on other streams or threads run before or after
    with streams.using(stream, given) as run_on, turn_of(workspace):
        # PyTorch tensors viewed without DLPack's stream handshake where the call runs on
        # PyTorch's current stream (out= is like q: the same framework)
        ordered = streams.on_torch_stream(given)
        q_view, bits_of = arrays.query_to_cupy(q, ordered=ordered)  # a bfloat16 or float8 query: its bits
        try:
            views = (q_view, *(arrays.to_cupy(x, ordered=ordered) for x in given[1:]))
            cu_seqlens = None if _cu_seqlens is None else arrays.to_cupy(_cu_seqlens, ordered=ordered)
        except (RuntimeError, BufferError) as exc:  # DLPack's refusal of a tensor, naming nothing
            arrays.refused(names + ("cu_seqlens_q",), given + (_cu_seqlens,), exc)
        q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens = views
        prob = _validate.check_score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens,
                                          top_k, values=validate, cu_seqlens=cu_seqlens, q_bits_of=bits_of)
        check_key_alignment(prob, keys_fp4, key_scale)
        return run_checked(precision, prob, q.data.device_id, (q, w, keys_fp4, key_scale, key_gscale),
                           block_table, valid_lens, cu_seqlens, like, out, return_scores, physical,
                           workspace_budget, workspace, ordered=ordered, run_on=run_on, score_only=_score_only,
                           fast_kernel=_fast_kernel, select=_select,
                           # out= apart from the inputs: a check of their addresses, ~4-8 us of host time,
                           # skipped with the value checks in a hot loop (docs/performance.md v47)
                           readers=(_readers_of(like, names, given, views, _readers)
                                    if out is not None and validate else None))


def _readers_of(like, names, given, views, grouped):
    """(name, extent) of the memory a call's ``out=`` must keep apart from: the caller's host
    arrays for a host result, else the checked (contiguous) views, and the grouped call's
    own arguments ``grouped`` ((name, array) pairs: its (B, L) table and offsets)."""
    if isinstance(like, np.ndarray):
        named = [(name, arrays.byte_extent(x)) for name, x in zip(names, given)]
    else:
        named = outbuf.extents(zip(names, views))
    return named + [(name, arrays.byte_extent(x)) for name, x in grouped]


def check_key_alignment(prob, keys_fp4, key_scale):
    """The pool's alignment every kernel needs (CuPy arrays): ValueError naming the array."""
    # the kernels copy key rows with 16-byte (codes) and 4-byte (scales) asynchronous copies
    _check_alignment("keys_fp4", keys_fp4, 16)
    if (prob.D // 16) % 4 == 0:  # scale rows then go by 4-byte copies (else byte loads)
        _check_alignment("key_scale", key_scale, 4)


def run_checked(precision, prob, device_id, query_and_pool, block_table, valid_lens, cu_seqlens, like, out,
                return_scores, physical, workspace_budget, workspace, *, plan=None, ordered=False, run_on=None,
                score_only=False, fast_kernel="auto", select="auto", readers=None):
    """The launches and results of a call whose arrays are checked CuPy arrays (the end of
    ``score_topk``, and each call of an ``indexer.PreparedCall``): ``query_and_pool`` is
    (q, w, keys_fp4, key_scale, key_gscale), ``block_table`` the per-token (T, L) table;
    ``like`` the caller's ``q`` (the result's framework), ``out`` as ``score_topk`` takes it
    (checked here), ``plan`` the call's launch plan where the caller holds it (else looked
    up), ``ordered`` as ``arrays.to_cupy`` takes it, ``run_on`` the call's stream or None;
    ``readers``: (name, extent) pairs of the caller's memory, which ``out`` must not overlap
    (``arrays.byte_extent``), or None: not checked."""
    workspace_budget = _budget(workspace_budget, cu_seqlens)
    host_result = isinstance(like, np.ndarray)
    if out is not None and host_result:
        targets = outbuf.check_host(out, prob.T, prob.top_k, return_scores)
    elif out is not None:
        targets = outbuf.device_views(out, like, prob.T, prob.top_k, return_scores, device_id, ordered=ordered)
    if out is not None and readers is not None:
        outbuf.check_apart(targets, return_scores, readers)
    with cp.cuda.Device(device_id):
        dev = device_facts(device_id)
        if out is not None and not host_result:
            indices, scores = targets  # the caller's memory: nothing allocated for the result
        else:
            indices = cp.empty((prob.T, prob.top_k), dtype=cp.int32)
            scores = cp.empty((prob.T, prob.top_k), dtype=cp.float32) if return_scores else None
        _launch(precision, prob, dev, device_id, *query_and_pool, block_table, valid_lens, indices, scores,
                physical, workspace_budget, score_only, fast_kernel, workspace=workspace, select=select,
                cu_seqlens=cu_seqlens, plan=plan)
        if out is not None:
            if host_result:
                indices.get(stream=run_on, out=targets[0])
                if scores is not None:
                    scores.get(stream=run_on, out=targets[1])
            return outbuf.returned(out, return_scores)
        if host_result:
            indices = indices.get()
            scores = scores.get() if scores is not None else None
        else:
            indices = arrays.wrap_like(indices, like)
            scores = arrays.wrap_like(scores, like) if scores is not None else None
    return (indices, scores) if return_scores else indices


def plan_alignment(q_ptr, key_scale_ptr):
    """What of the arrays' placement a launch plan depends on: whether ``q`` and
    ``key_scale`` (their device pointers) are 16-byte aligned (``_scoring_kernel``)."""
    return q_ptr % 16 == 0, key_scale_ptr % 16 == 0


def launch_plan(precision, prob, device_id, q, key_scale, workspace_budget, cu_seqlens):
    """The launch plan of a call of the default kernels and select (``_plan``; its kernels
    compiled now), for ``indexer.PreparedCall``; ``workspace_budget`` as ``_budget`` takes it."""
    return _plan(precision, prob, device_facts(device_id), device_id, q, key_scale,
                 _budget(workspace_budget, cu_seqlens), "auto", "auto", cu_seqlens)


def _budget(workspace_budget, cu_seqlens):
    """``workspace_budget``, or where None the default of ``score_topk`` or, for grouped
    calls (``cu_seqlens``), of ``score_topk_ragged``."""
    if workspace_budget is not None:
        return workspace_budget
    return geometry.DEFAULT_WORKSPACE_BYTES if cu_seqlens is None else geometry.DEFAULT_RAGGED_WORKSPACE_BYTES


def _carve(nbytes_by_name, workspace=None):
    """One device allocation cut into 256-byte aligned parts, one per name: (the base
    ``MemoryPointer``, {name: byte offset}, {name: bytes}). A call costs a single allocation
    from CuPy's pool however many buffers it needs. With an ``indexer.Workspace`` the parts
    are cut from its buffer for the current device instead (grown if too small), so the call
    takes nothing from the pool (CUDA-graph safe). ``_run_views`` makes the typed arrays."""
    offsets, total = {}, 0
    for name, nbytes in nbytes_by_name.items():
        offsets[name] = total
        total += -(-nbytes // 256) * 256
    if workspace is None:
        base = cp.cuda.alloc(max(total, 1))
    else:
        base = workspace.buffer(max(total, 1)).data
    return base, offsets, nbytes_by_name


# the Hopper scoring kernels' geometry and every kernel's source, by the name _scoring_kernel gives
_WGMMA_LAUNCHES = {"ws": geometry.score_ws_launch, "pairs": geometry.score_wgmma_pairs_launch,
                   "wgmma": geometry.score_wgmma_launch, "ks": geometry.score_ks_launch,
                   "dense": geometry.score_dense_launch}
_SCORING_SOURCES = {"fp32": "score_fp32.cu", "mma": "score_mma.cu", "wgmma": "score_wgmma.cu",
                    "pairs": "score_wgmma.cu", "ws": "score_ws.cu", "ks": "score_ks.cu",
                    "dense": "score_dense.cu"}
#: whether the balanced wgmma kernels' CTAs claim their shares of tiles (else equal shares:
#: for A/Bs; docs/performance.md v71)
_CLAIMED_SHARES = True
#: whether the wgmma kernels take each segment's queries as bulk copies of the images
#: wgmma_prep_kernel writes: the single-query kernel one copy (else 1,024 16-byte copies of
#: prep_query_kernel's rows, half its weights halved in shared memory: score_wgmma_kernel<D,
#: true>), the pair kernel a copy a K chunk and query (else both queries staged from fp32 by
#: the kernel, one after the other: score_wgmma_pairs_kernel<D, true>); for A/Bs
_QUERY_IMAGE = True
#: whether a pair call with many lone rows scores them in a launch of their own
#: (geometry.pairs_split); for A/Bs
_PAIRS_SPLIT = True
#: the select kernels' source (a name, so that scripts/ab_kernels.py can swap in another version)
_SELECT_SOURCE = "select_fast.cu"


#: the scoring kernels score_topk's _fast_kernel may force ('auto': the rules of _scoring_kernel)
_FAST_KERNELS = ("auto", "mma", "wgmma", "wgmma-single", "pairs", "ws", "ks", "dense")


def _scoring_kernel(precision, prob, dev, q, key_scale, fast_kernel, cu_seqlens):
    """The scoring kernel a call takes: 'fp32' (the exact path, FP32 CUDA cores), or for the
    fast path 'ws' (warp-specialised wgmma: a single row, or a few long ones:
    geometry.ws_preferred), 'pairs' (wgmma, rows of one
    sequence in pairs sharing each key tile), 'wgmma' (one query a tile), 'ks' (keys
    stationary: every row of a sequence streamed past its key groups decoded once; see
    geometry.ks_preferred), 'dense' (a sequence's keys decoded once to an fp16 image, three
    rows at a time multiplied against it; see geometry.dense_preferred) or 'mma' (mma.sync:
    other shapes and GPUs). ``fast_kernel`` ('auto', 'mma', 'wgmma', 'wgmma-single', 'pairs',
    'ws', 'ks', 'dense') forces a choice, for tests and benchmarks ('wgmma' takes the pair
    kernel for rows of sequences where there are more rows than sequences,
    geometry.pairs_preferred, as 'auto' does where no grouped kernel is preferred and the
    call has work enough for it, geometry.pairs_pay);
    raises ValueError for another name, or an array whose alignment or layout the forced
    kernel cannot take."""
    if fast_kernel not in _FAST_KERNELS:
        raise ValueError(f"fast_kernel: expected one of {', '.join(map(repr, _FAST_KERNELS))}, got {fast_kernel!r}")
    if precision == "exact":
        return "fp32"
    if fast_kernel in ("dense", "ks"):  # the grouped kernels forced: the shapes and offsets they take
        supported, max_seqs = ((geometry.dense_supported, geometry.DENSE_MAX_SEQS) if fast_kernel == "dense"
                               else (geometry.ks_supported, geometry.KS_MAX_SEQS))
        if not supported(prob.H, prob.D, dev, prob.E):
            raise ValueError(f"fast_kernel: '{fast_kernel}' needs sm_90, H <= 64, D = 128 and a power-of-two E")
        if cu_seqlens is None or not 2 <= cu_seqlens.shape[0] <= max_seqs + 1:
            raise ValueError(f"fast_kernel: '{fast_kernel}' scores the rows of 1 to {max_seqs} sequences "
                             f"(cu_seqlens of 2 to {max_seqs + 1} offsets)")
        # the dense kernel stages the query by 16-byte loads (8-byte ones of a 16-bit query)
        # and prefetches its rows in 16-byte aligned bulk; the keys-stationary kernel copies
        # whole blocks' scale rows in 16-byte pieces
        _check_alignment(*(("q", q) if fast_kernel == "dense" else ("key_scale", key_scale)), 16)
        return fast_kernel
    # the warp-specialised and pair kernels stage the query themselves by 16-byte (16-bit: 8-byte)
    # loads; a query view off that alignment takes the kernels that read it through the
    # staging kernel instead
    q_aligned = q.data.ptr % 16 == 0
    # the wgmma kernels' bulk copies need 16-byte aligned scale rows of whole blocks
    aligned = key_scale.data.ptr % 16 == 0
    # A grouped call's own kernels, where 'auto' takes them: the dense kernel, else the
    # keys-stationary one, else rows of a sequence in pairs. A grouped call of no more rows
    # than sequences (geometry.pairs_preferred false) has at most a few rows that share a
    # sequence, not worth the pair kernel, and one of too little work (geometry.pairs_pay
    # false: few requests of a few rows each) is faster without its fixed costs: their rows
    # go as the per-token call's would.
    auto = fast_kernel == "auto"
    n_seq = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else 0
    dense = (auto and cu_seqlens is not None and q_aligned
             and geometry.dense_preferred(prob.T, prob.H, prob.D, prob.max_len, dev, prob.E, n_seq))
    ks = (auto and cu_seqlens is not None and not dense
          and geometry.ks_preferred(prob.T, prob.H, prob.D, prob.max_len, dev, prob.E, n_seq))
    pairs = (cu_seqlens is not None and geometry.pairs_preferred(prob.T, n_seq)
             and (not auto or geometry.pairs_pay(prob.T, prob.max_len, n_seq)))
    use_ws = fast_kernel == "ws" or (
        auto and aligned and q_aligned and not (dense or ks or pairs)
        and geometry.ws_preferred(prob.T, prob.H, prob.D, dev, prob.E, max_len=prob.max_len))
    use_wgmma = use_ws or fast_kernel in ("wgmma", "wgmma-single", "pairs") or (
        fast_kernel == "auto" and geometry.wgmma_supported(prob.H, prob.D, dev, prob.E) and aligned)
    if use_wgmma:
        _check_alignment("key_scale", key_scale, 16)
    if use_ws:
        _check_alignment("q", q, 16)
        return "ws"
    if not use_wgmma:
        return "mma"
    if fast_kernel == "pairs":  # forced: it stages the query by 16-byte loads
        if cu_seqlens is None:
            raise ValueError("fast_kernel: 'pairs' scores the rows of sequences (cu_seqlens)")
        _check_alignment("q", q, 16)
        return "pairs"
    # rows of one sequence in pairs: each key tile decoded once for two queries; the pair
    # kernel takes runs of at most MAX_PAIR_ROWS rows (prefill's thousands of short
    # rows run as several such runs rather than one per-row launch without sharing)
    if dense:
        return "dense"  # many rows of a sequence over few keys: the keys decoded once, a GEMM over them
    if ks:
        return "ks"  # chunks of sequences over longer pools: each key group decoded once for a sequence's rows
    if pairs and fast_kernel != "wgmma-single" and q_aligned:
        return "pairs"
    return "wgmma"


# Plans of calls already made, by their shapes and choices (the key in _plan): what _launch
# decides before its first launch depends only on those, and deciding it again cost an
# eager call 30-80 us of host time (docs/performance.md v42). Cleared when full (a process
# sees few call shapes), and by clear_plans() where a test replaces a geometry rule.
_PLANS = {}
_PLANS_MAX = 256


def clear_plans() -> None:
    """Forget every cached launch plan (after changing a rule in ``geometry``)."""
    _PLANS.clear()


def _plan(precision, prob, dev, device_id, q, key_scale, workspace_budget, fast_kernel, select, cu_seqlens):
    """The launch plan of a call (``_make_plan``), cached by everything it depends on: the
    precision, the problem's integers, the device, the budget, the forced kernel and select,
    the number of sequences, and the 16-byte alignment of ``q`` and ``key_scale``, which
    pick the scoring kernel. A call whose plan raises (a forced kernel that cannot take
    the arrays) caches nothing and raises again next time."""
    key = (precision, prob, device_id, workspace_budget, fast_kernel, select,
           None if cu_seqlens is None else cu_seqlens.shape[0], q.data.ptr % 16 == 0, key_scale.data.ptr % 16 == 0)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(precision, prob, dev, device_id, q, key_scale, workspace_budget, fast_kernel, select,
                          cu_seqlens)
        plan.key = key  # names the plan's workspace views (Workspace.views)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


class _LaunchPlan:
    """What a call launches, decided from its shapes alone (``_make_plan``): the scoring
    kernel and its geometry, the runs of rows, the select's kernels and grids, the
    workspace's part sizes, and the scalar arguments that never change between calls."""


def _make_plan(precision, prob, dev, device_id, q, key_scale, workspace_budget, fast_kernel, select, cu_seqlens):
    """A new ``_LaunchPlan`` for ``_launch``'s arguments of the same names (its kernels
    compiled or looked up here); raises ValueError where a forced kernel cannot take them."""
    check_device(dev, device_id)  # an older GPU is refused before anything compiles
    i32 = np.int32
    p = _LaunchPlan()
    p.exact = exact = precision == "exact"
    p.kind = kind = _scoring_kernel(precision, prob, dev, q, key_scale, fast_kernel, cu_seqlens)
    # whether the scoring kernel counts the select's histogram itself (else a kernel of its own does)
    p.counts_keys = counts_keys = kind not in ("fp32", "ks", "dense")
    # the workspace is cut into runs of rows under the budget; the launch is sized for a run
    # (sizing it for all T rows would give a run of few rows a grid of few CTAs)
    ld = geometry.tiles_per_row(prob.max_len) * geometry.TILE_ENTRIES
    # heads of the fp16 query that prep_query_kernel stages for the kernel as rows (0: the
    # kernel reads the query itself, or, keys-stationary, ks_prep_kernel writes the
    # kernel's query images instead)
    # (or, the wgmma kernels with _QUERY_IMAGE, wgmma_prep_kernel writes them as an image a row)
    p.wgmma_image = kind in ("wgmma", "pairs") and _QUERY_IMAGE
    p.heads = heads = (64 if kind == "wgmma" and not p.wgmma_image
                       else 8 * geometry.mma_head_blocks(prob.H) if kind == "mma" else 0)
    query_bytes = (heads * (prob.D + 8) * 2 + heads * 4 + (geometry.KS_QUERY_BYTES if kind == "ks" else 0)
                   + (geometry.wgmma_query_image_bytes(prob.D) if p.wgmma_image else 0))
    # short rows: one CTA per row selects straight from the scores (no histogram, no buffer):
    # rows of up to 2,048 entries always, rows of up to 4,096 where there are enough of them
    # to fill the SMs (geometry.row_select_preferred)
    p.row_select = row_select = select == "rows" or (select == "auto"
                                                     and geometry.row_select_preferred(prob.T, ld, dev))
    p.rows = rows = geometry.workspace_rows(prob.T, ld, workspace_budget, query_bytes, row_select,
                                            max_rows=(geometry.MAX_PAIR_ROWS if kind == "pairs"
                                                      else geometry.DENSE_MAX_ROWS if kind == "dense"
                                                      else geometry.MAX_BALANCED_ROWS if kind == "ws" else None))
    if exact:
        sl = geometry.score_fp32_launch(rows, prob.H, prob.D, prob.max_len, dev)
    elif kind == "mma":
        sl = geometry.score_mma_launch(rows, prob.H, prob.D, prob.max_len, dev)
    else:
        sl = _WGMMA_LAUNCHES[kind](rows, prob.H, prob.D, prob.max_len, dev, E=prob.E)
    assert sl.ld == ld
    p.sl = sl
    bins, p.cap = geometry.HIST_BINS, geometry.CANDIDATE_CAP
    # the select's counters: a histogram and a candidate count a row. The counts are cleared
    # by the kernel before the filter (the scoring kernel; the exact path's histogram
    # kernel), so they are scratch. The histograms: with a workspace they sit in its
    # "zeroed" part, which every complete call leaves zero (the rank / final kernel clears
    # each row's), so a call fills them only when the workspace says they may not be (see
    # indexer/workspace.py); without one they come from the call's allocation and the first
    # run fills them. A scoring-only call (the benchmark's) counts into scratch it never
    # clears, so that the zeroed part stays zero for any graph captured on it.
    # Runs whose scoring kernel counts no histogram (keys-stationary) take each row's
    # candidate threshold from a sample of its scores (topk_sample_kernel: 32 KB a row read)
    # instead of a histogram pass over all of them, where its ~2k candidates fit the buffer;
    # runs that rank their candidates (few rows) keep the histogram pass, and so do runs of
    # an SM's worth of short rows, which stream their select (geometry.sampled_streams).
    p.sampled_ok = sampled_ok = (not row_select and not counts_keys
                                 and (select == "sampled" or (select == "auto" and kind == "ks"))
                                 and geometry.sampled_threshold_fits(prob.top_k, ld))

    def takes_sample(nr):  # whether a run of nr rows takes the sampled threshold
        return sampled_ok and (select == "sampled" or not (geometry.rank_select(nr, prob.top_k, dev)
                                                           or geometry.sampled_streams(nr, prob.top_k, ld, dev)))

    # no histograms where every run takes the sample: the runs are of two sizes at most, a
    # full one and the last (rank_select holds for fewer rows, sampled_streams for more)
    last_run = prob.T - rows * ((prob.T - 1) // rows)
    every_run_sampled = takes_sample(last_run) and takes_sample(min(rows, prob.T))
    # the dense kernel's rows handed to the row select as the CTAs holding them end: a count
    # a row, zero at rest, in the workspace's zeroed part (the row kernel clears each row's); with
    # no workspace at rest the select waits for the whole scoring kernel instead (a fill
    # would cost what the early start gains), and so do rows too long for the registers
    # (their passes read through the read-only path)
    p.row_ready = row_ready = kind == "dense" and row_select and ld <= geometry.ROW_SELECT_MAX_LEN
    p.hist_bytes = (rows * 4 if row_ready else 0 if row_select or every_run_sampled
                    else rows * bins * 4)
    # each run of rows: its bounds, and (multi-CTA select) whether it takes the sampled
    # threshold, streams its rows (a CTA a row, no candidate buffer) or ranks its candidates
    # (else sorted a row a CTA)
    p.runs = []
    for r0 in range(0, prob.T, rows):
        r1 = min(prob.T, r0 + rows)
        nr = r1 - r0
        sampled = not row_select and takes_sample(nr)
        streamed = not row_select and not sampled and geometry.row_stream_select(nr, prob.top_k, dev)
        ranked = not row_select and not sampled and not streamed and geometry.rank_select(nr, prob.top_k, dev)
        p.runs.append((r0, r1, nr, sampled, streamed, ranked, i32(r0), i32(nr)))
    # whether any run appends candidates to the buffer in global memory (filter, then rank or final)
    p.buffers = any(not streamed for _, _, _, _, streamed, _, _, _ in p.runs) and not row_select
    # the workspace's parts, in their order (the histograms' size is the call's: a workspace
    # at rest keeps them in its zeroed part)
    p.part_bytes = {
        "q16": rows * heads * (prob.D + 8) * 2,    # fast path: the staged query of a run
        "w_scaled": rows * heads * 4,
        # the keys-stationary kernel's query images, or the single-query wgmma kernel's
        "qimg": (rows * geometry.KS_QUERY_BYTES if kind == "ks"
                 else rows * geometry.wgmma_query_image_bytes(prob.D) if p.wgmma_image else 0),
        # the dense kernel's fp16 key image of each sequence
        "kimg": geometry.dense_image_bytes(cu_seqlens.shape[0] - 1, prob.max_len) if kind == "dense" else 0,
        "scores": rows * sl.ld * 4,                  # float32 scores of a run of rows
        "hist": 0,  # hist_bytes where the workspace's zeroed part does not hold them (set by _launch)
        # a run that streams its rows (topk_row_stream_kernel) gathers its candidates in
        # shared memory: a call whose runs all stream keeps no buffer and no counts
        "count": 0 if not p.buffers else rows * 4,
        "cand": 0 if not p.buffers else rows * p.cap * 8,        # candidate (key, index) pairs
        "tau": rows * 4 if sampled_ok else 0,                    # sampled thresholds
    }
    p.ld = np.int64(sl.ld)

    # (score_wgmma_kernel<D> takes the query images; <D, true> the staged rows)
    name = sl.name if kind not in ("wgmma", "pairs") or p.wgmma_image else f"{sl.name[:-1]}, true>"
    if kind in ("fp32", "ws", "dense") or (kind == "pairs" and not p.wgmma_image):  # it reads q itself
        name = _jit.query_instance(name, prob.q_dtype)
    # a pair call with many lone rows: the shared pairs in one launch, the lone rows in a
    # second with m64n64 MMAs (geometry.pairs_split; the halves' kernels at score_wgmma.cu's
    # score_wgmma_pairs::kSharedUnits and kLoneRows)
    p.lone_k = None
    if _PAIRS_SPLIT and kind == "pairs" and p.wgmma_image and geometry.pairs_split(prob.T, cu_seqlens.shape[0] - 1):
        name = f"{sl.name[:-1]}, false, float, 1>"
        p.lone_k = _kernel(_SCORING_SOURCES[kind], f"{sl.name[:-1]}, false, float, 2>", device_id, sl.smem)
    p.score_k = _kernel(_SCORING_SOURCES[kind], name, device_id, sl.smem)
    if exact:
        p.shape_args = (i32(prob.H), i32(prob.D), i32(prob.P), i32(prob.E), i32(prob.L))
    else:
        if kind in ("pairs", "ks", "dense"):
            p.n_seq = i32(cu_seqlens.shape[0] - 1)
        if kind == "dense":  # each sequence's keys decoded once a run, then the GEMM over them
            p.keys_k = _kernel(_SCORING_SOURCES[kind], f"dense_keys_kernel<{prob.D}>", device_id)
            p.units = i32(geometry.dense_units(prob.max_len))
        if kind == "ks":  # each query's B operand and weights as one bulk copy brings them
            p.prep_k = _kernel(_SCORING_SOURCES[kind], _jit.query_instance(f"ks_prep_kernel<{prob.D}>", prob.q_dtype),
                               device_id)
        if p.wgmma_image:  # the same for the wgmma kernels (half the weights halved: score_wgmma::fma_relu_head)
            prep = _jit.query_instance(f"wgmma_prep_kernel<{prob.D}>", prob.q_dtype)
            p.prep_k = _kernel(_SCORING_SOURCES[kind], prep, device_id)
        if heads:  # the query in the K order of the kernel's decode, by a kernel of its own
            p.prep_k = _kernel("score_mma.cu", _jit.query_instance(f"prep_query_kernel<{prob.D}, {heads // 8}>",
                                                                   prob.q_dtype), device_id)
        e_shift = prob.E.bit_length() - 1 if prob.E & (prob.E - 1) == 0 else -1
        p.shape_args = (i32(prob.P), i32(prob.E), i32(e_shift), i32(prob.L))
    # only the select this call takes is compiled and looked up
    if row_select:
        # rows up to ROW_SELECT_MAX_LEN entries sit in registers (16 a thread; 128 threads a
        # row up to 2,048 entries); longer ones (the row select forced, for tests) are read
        # by every pass
        row_name, p.row_threads = geometry.row_select_kernel(ld, prob.top_k, _validate.MAX_TOP_K)
        p.row_k = _kernel(_SELECT_SOURCE, row_name, device_id)
    else:
        # the kernels of the routes its runs take, and only those (a kernel compiles in ~1 s
        # on a cold cache): sampled, streamed, ranked, or else the filter and the final sort
        per = geometry.select_fast_per_thread(rows, sl.ld, dev)
        routes = [(sampled, streamed, ranked) for _, _, _, sampled, streamed, ranked, _, _ in p.runs]
        histogram = any(not s for s, _, _ in routes)
        filtered = any(not s and not st for s, st, _ in routes)
        if not counts_keys and histogram:  # the other scoring kernels count the histogram in their epilogue
            p.hist_k = _kernel(_SELECT_SOURCE, f"topk_histogram_kernel<256, {per}>", device_id)
        if filtered:
            p.filter_k = _kernel(_SELECT_SOURCE, f"topk_filter_kernel<256, {per}>", device_id)
        if any(r for _, _, r in routes):
            all_pairs = geometry.rank_all_pairs(rows, prob.top_k)
            p.rank_k = _kernel(_SELECT_SOURCE, f"topk_rank_kernel<256, {'true' if all_pairs else 'false'}>",
                               device_id)
            p.rank_ctas = (geometry.rank_all_pairs_ctas_per_row(rows, dev) if all_pairs
                           else geometry.rank_ctas_per_row(prob.top_k, rows, dev))
        if any(not s and not st and not r for s, st, r in routes):
            p.final_k = _kernel(_SELECT_SOURCE, f"topk_final_kernel<1024, {p.cap}>", device_id, 8 * p.cap)
        if any(st for _, st, _ in routes):
            p.stream_k = _kernel(_SELECT_SOURCE, f"topk_row_stream_kernel<{geometry.ROW_STREAM_THREADS}>",
                                 device_id, geometry.ROW_STREAM_SMEM)
        if any(s for s, _, _ in routes):
            p.sample_k = _kernel(_SELECT_SOURCE, "topk_sample_kernel<256>", device_id)
            p.filter_sampled_k = _kernel(_SELECT_SOURCE, f"topk_filter_kernel<256, {per}, true>", device_id)
            p.final_sampled_k = _kernel(_SELECT_SOURCE, f"topk_final_kernel<1024, {p.cap}, true>", device_id,
                                        8 * p.cap)
        p.chunks = geometry.select_fast_chunks(sl.ld, per)
    # the scalar arguments every call passes alike
    p.D = prob.D
    p.H, p.max_len, p.top_k = i32(prob.H), i32(prob.max_len), i32(prob.top_k)
    p.cap32 = i32(p.cap)
    p.table_shape = (i32(prob.L), i32(prob.E), i32(prob.P))
    return p


class _RunViews:
    """The workspace's parts a call's launches take, as typed views (``_run_views``)."""


def _part_sizes(p, at_rest):
    """``_carve``'s sizes for plan ``p``: its parts, with the histograms in scratch only where
    the workspace's zeroed part does not hold them (``at_rest``)."""
    return {**p.part_bytes, "hist": 0 if at_rest or p.row_ready else p.hist_bytes}


def _run_views(p, parts, rest=None):
    """The typed arrays of plan ``p``'s launches over ``parts`` (``_carve``'s base pointer,
    offsets and sizes; None where a part is empty): scores float32 [rows, ld]; hist
    (scratch histograms) uint32, count uint32 [rows], cand uint64, tau uint32 [rows]; q16
    uint16 [rows, heads, D + 8] and w_scaled float32 [rows, heads] (the staged query); qimg
    and kimg (uint8 images); hist_rest uint32: the histograms in the workspace's zeroed part
    (``rest``, uint8), or None. Each array is built straight over its bytes (~1.4 us of host
    time) where slicing a byte buffer, viewing and reshaping took three steps (~5 us)."""
    base, offsets, sizes = parts

    def typed(name, dtype, shape=None):
        nbytes = sizes[name]
        if not nbytes:
            return None
        return cp.ndarray(shape or (nbytes // np.dtype(dtype).itemsize,), dtype, base + offsets[name])

    v = _RunViews()
    v.hist_rest = None if rest is None else rest.view(cp.uint32)
    v.scores = typed("scores", cp.float32, (p.rows, p.sl.ld))
    v.hist, v.count, v.cand, v.tau = (typed("hist", cp.uint32), typed("count", cp.uint32),
                                      typed("cand", cp.uint64), typed("tau", cp.uint32))
    v.q16 = v.w_scaled = None
    if p.heads:
        v.q16 = typed("q16", cp.uint16, (p.rows, p.heads, p.D + 8))
        v.w_scaled = typed("w_scaled", cp.float32, (p.rows, p.heads))
    v.qimg, v.kimg = typed("qimg", cp.uint8), typed("kimg", cp.uint8)
    return v


def _zero(x):  # gpu-only
    """Clear CuPy array ``x`` (contiguous) on the current stream: a memset (~2 us of host
    time) where ``x.fill(0)`` launched an elementwise kernel (~7 us)."""
    cp.cuda.runtime.memsetAsync(x.data.ptr, 0, x.nbytes, cp.cuda.get_current_stream().ptr)


def _launch(precision, prob, dev, device_id, q, w, keys_fp4, key_scale, key_gscale, block_table,
            valid_lens, indices, scores, physical, workspace_budget, score_only=False, fast_kernel="auto", workspace=None,
            select="auto", cu_seqlens=None, plan=None):
    """Scores of a run of query rows into a float32 workspace (FP32 CUDA cores for 'exact';
    fp16 tensor cores for 'fast': wgmma on Hopper where it applies, else mma.sync), then
    the exact multi-CTA select. ``score_only`` stops after the scoring kernel (the
    benchmark's "scoring part alone"); ``fast_kernel`` picks the tensor-core kernel (see
    ``_scoring_kernel``) and ``select`` ('auto', 'rows': one CTA per row, 'multi': the
    multi-CTA passes, 'sampled' / 'histogram': those with each row's candidate threshold
    from a sample of its scores / from a histogram pass, where the scoring kernel counts no
    histogram itself) the select, for tests and benchmarks. ``cu_seqlens`` (int32 (B+1,),
    the varlen layout of ``score_topk_ragged``) lets the wgmma path score consecutive rows
    of one sequence as pairs sharing each key tile."""
    i32 = np.int32
    p = plan if plan is not None else _plan(precision, prob, dev, device_id, q, key_scale, workspace_budget,
                                            fast_kernel, select, cu_seqlens)
    kind, sl = p.kind, p.sl
    clean = (workspace.zeroed_state(p.hist_bytes) if workspace is not None and p.hist_bytes > 0 and not score_only
             else None)
    at_rest = clean is not None  # None also while capturing before the part exists (see Workspace.zeroed)
    if workspace is None:  # a new allocation every call
        v = _run_views(p, _carve(_part_sizes(p, False)))
    else:  # cut once a plan while the workspace keeps its buffers
        v = workspace.views((p.key, at_rest), lambda: _run_views(
            p, _carve(_part_sizes(p, at_rest), workspace), workspace.zeroed(p.hist_bytes)[0] if at_rest else None))
    if at_rest:
        hist, hist_zero = v.hist_rest, clean  # [rows, bins]
        workspace.mark_zeroed(False)  # until this call's last launch is enqueued
    else:  # filled before the first run; a scoring-only call's are never read
        hist, hist_zero = v.hist, score_only
    if hist is None:  # none needed (the row select; runs that all take the sample): never filled
        hist, hist_zero = 0, True  # a null pointer for the sampled final kernel, which ignores it
    physical32 = i32(1 if physical else 0)
    count = 0 if v.count is None else v.count  # none where every run streams: a null pointer (never read)
    # the balanced wgmma kernels' CTAs claim their shares from two counters, zero at rest
    # (kernels/wgmma_common.cuh: ShareClaims): the workspace's, else the call's own
    # (none where a capture starts before the workspace holds them: equal shares then); a
    # pair for the even runs, one for the odd (the next run's scoring kernel may start before
    # this one's last CTAs have cleared theirs: Workspace.claim_counters)
    # (a split pair call's lone-row launch claims from a third and fourth pair: it may start
    # before the shared pairs' last CTAs have cleared theirs)
    claims = (0, 0, 0, 0)
    if _CLAIMED_SHARES and (kind == "pairs" or (kind == "wgmma" and sl.balanced)):
        if workspace is None:
            own = cp.empty(8, dtype=cp.uint32)
            _zero(own)
            # sliced only where two launches claim apart (a slice costs ~2 us of host time)
            claims = ((own[:2], own[2:4], own[4:6], own[6:]) if len(p.runs) > 1 or p.lone_k is not None
                      else (own,) * 4)
        else:
            claims = workspace.claim_counters() or claims

    try:
        for run_index, (r0, r1, nr, sampled, streamed, ranked, r0_32, nr_32) in enumerate(p.runs):
            # the run's rows of the per-row arrays: the arrays themselves when one run takes
            # every row (a slice costs ~2 us of host time, and a call makes up to eight)
            run = (lambda x: x) if nr == prob.T else (lambda x: x[r0:r1])  # noqa: B023
            if not hist_zero and (p.row_ready or not p.row_select):
                _zero(hist)  # then each run's select leaves them zero for the next
                hist_zero = True
            lens, table = run(valid_lens), run(block_table)  # each sliced once a run
            if p.exact:
                query = (run(q), run(w))
            elif p.heads:  # the run's queries, staged in fp16 (per-head power-of-two scale) with scaled weights
                # two heads a warp, eight warps a CTA (kernels/fast_common.cuh: kPrepHeadsPerWarp)
                p.prep_k((nr, p.heads // 16), (256,), (run(q), run(w), p.H, v.q16, v.w_scaled))
                query = (v.q16, v.w_scaled)
            elif kind == "ks":  # the same staging, written as the kernel's query images
                p.prep_k((nr, 64 // 16), (256,), (run(q), run(w), p.H, lens, p.max_len, v.qimg))
                query = (v.qimg,)
            elif p.wgmma_image:  # the same staging as the wgmma kernels' query images
                p.prep_k((nr, 64 // 16), (256,), (run(q), run(w), p.H, v.qimg))
                query = (v.qimg, 0) if kind == "wgmma" else (v.qimg, 0, p.H)
            else:  # staged by the scoring kernel itself ("ws"; "pairs" with _QUERY_IMAGE off)
                query = (run(q), run(w), p.H)
            if kind == "dense":  # the run's sequences' key images, then the GEMM over them (not the pool)
                p.keys_k((int(p.units), int(p.n_seq)), (256,),
                         (keys_fp4, key_scale, key_gscale, table, cu_seqlens, p.n_seq, r0_32, nr_32, *p.shape_args,
                          v.kimg, p.units))
                # under the key image's tail: its schedule built while the image is written
                after_previous(p.score_k, device_id, sl.grid, sl.block,
                               (*query, v.kimg, p.units, lens, cu_seqlens, p.n_seq, r0_32, nr_32, p.max_len, v.scores,
                                p.ld, hist if p.row_ready else 0), shared_mem=sl.smem)
            else:
                if kind == "pairs":  # row pairs of one sequence share each key tile (one wave, balanced)
                    grid, sched_args = sl.grid, (cu_seqlens, p.n_seq, r0_32, nr_32, *p.shape_args)
                elif kind == "ws":  # one CTA per SM, balanced
                    grid, sched_args = sl.grid, (nr_32, *p.shape_args)
                elif kind == "ks":  # one CTA per SM, equal shares of (sequence, key group, row) items
                    grid, sched_args = sl.grid, (cu_seqlens, p.n_seq, r0_32, nr_32, *p.shape_args)
                elif sl.balanced:  # one wave shares all rows' tiles (wgmma kernel)
                    grid, sched_args = sl.grid, (nr_32, *p.shape_args, i32(0), i32(1))
                elif kind == "wgmma":
                    grid, sched_args = (nr, sl.grid[1]), (nr_32, *p.shape_args, i32(sl.tiles_per_cta), i32(0))
                else:
                    grid, sched_args = (nr, sl.grid[1]), (*p.shape_args, i32(sl.tiles_per_cta))
                score_args = (*query, keys_fp4, key_scale, key_gscale, table, lens,
                              *sched_args, v.scores, p.ld,
                              *(() if not p.counts_keys else (0, 0) if p.row_select else (hist, count)),
                              *((claims[run_index % 2],) if kind in ("wgmma", "pairs") else ()))
                if kind == "wgmma" or p.wgmma_image:  # starts under the staging kernel (score_wgmma.cu)
                    after_previous(p.score_k, device_id, grid, sl.block, score_args, shared_mem=sl.smem)
                else:
                    p.score_k(grid, sl.block, score_args, shared_mem=sl.smem)
                if p.lone_k is not None:  # the run's lone rows, placed as the shared pairs' CTAs end
                    after_previous(p.lone_k, device_id, grid, sl.block, (*score_args[:-1], claims[2 + run_index % 2]),
                                   shared_mem=sl.smem)
            if score_only:  # counted into the histogram, never selected
                continue
            # every select kernel ends with the same arguments: where its winners go, and the
            # block table that turns them into physical ids
            output_args = (table, *p.table_shape, physical32, run(indices), run(scores) if scores is not None else 0)
            if p.row_select:
                # row_ready (dense kernel, workspace at rest): each row selected once the
                # CTAs holding it have ended, on the SMs the scoring kernel's CTAs leave
                after_previous(p.row_k, device_id, (nr,), (p.row_threads,),
                               (v.scores, p.ld, lens, p.max_len, p.top_k, *output_args,
                                hist if p.row_ready else 0))
                continue
            row_args = (v.scores, p.ld, lens, p.max_len)  # every select kernel's first four
            if sampled:  # each row's threshold key from a sample of its scores
                after_previous(p.sample_k, device_id, (nr,), (256,), (*row_args, p.top_k, count, v.tau))
            elif not p.counts_keys:  # the other scoring kernels count the histogram in their epilogue
                after_previous(p.hist_k, device_id, (p.chunks, nr), (256,), (*row_args, hist, count))
            if streamed:  # a CTA a row: its threshold, its candidates gathered and ranked at once
                after_previous(p.stream_k, device_id, (nr,), (geometry.ROW_STREAM_THREADS,),
                               (*row_args, hist, p.top_k, *output_args), shared_mem=geometry.ROW_STREAM_SMEM)
                continue
            after_previous(p.filter_sampled_k if sampled else p.filter_k, device_id, (p.chunks, nr), (256,),
                           (*row_args, v.tau if sampled else hist, p.top_k, v.count, v.cand, p.cap32))
            # few rows: candidates ranked by many CTAs per row (a row with more than RANK_MAX
            # is selected from its scores by one of them; the fewest rows compare every pair,
            # see geometry.rank_all_pairs); many rows: every row's candidates sorted by one CTA
            # (see geometry.rank_select). One launch either way.
            if ranked:
                after_previous(p.rank_k, device_id, (nr, p.rank_ctas), (256,),
                               (*row_args, hist, v.count, v.cand, p.cap32, p.top_k, *output_args))
            else:  # the sampled final kernel checks each row's count against tau
                after_previous(p.final_sampled_k if sampled else p.final_k, device_id, (nr,), (1024,),
                               (*row_args, hist, v.count, v.cand, p.top_k, *output_args, v.tau if sampled else 0),
                               shared_mem=8 * p.cap)
    except BaseException:
        if at_rest:  # stopped between its launches: clear what the launched kernels counted
            try:
                _zero(hist)
            except Exception:  # the stream is unusable; the workspace stays marked dirty
                pass
        raise
    if at_rest:
        workspace.mark_zeroed(True)
