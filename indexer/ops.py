"""``score_topk``: validate, pick a backend, then run the NumPy reference or the CUDA kernels."""

from __future__ import annotations

import numpy as np

from . import arrays, outbuf, ragged, reference, streams, validate as _validate
from .workspace import check_budget, check_workspace, turn_of

__all__ = ["score_topk", "score_topk_ragged", "BACKENDS", "PRECISIONS"]

BACKENDS = ("auto", "numpy", "cuda")
PRECISIONS = ("fast", "exact")

_NAMES = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens")


def _pick_backend(backend: str, inputs) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        # device arrays are scored where they live (the CUDA path refuses a GPU its kernels
        # cannot run on, by name); host arrays go to the GPU only where the kernels run
        return "cuda" if any(arrays.is_device_array(x) for x in inputs) or arrays.gpu_supported() else "numpy"
    if backend == "cuda" and not arrays.gpu_available():
        raise RuntimeError("backend='cuda': CuPy with a usable CUDA GPU is required (pip install cupy-cuda13x for CUDA 13 or cupy-cuda12x for CUDA 12)")
    return backend


def _check_call(precision, workspace, workspace_budget, stream, **flags):
    """The keyword arguments both public calls check before any array (each error names its
    argument); ``flags``: the boolean ones (return_scores, physical, validate) by name."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    for name, value in flags.items():
        _validate.check_flag(name, value)
    check_workspace(workspace)
    check_budget(workspace_budget)
    streams.check_stream(stream)


def _host_array(name, x):
    """``arrays.to_numpy(x)``; what NumPy cannot make an array of (a ragged list) is refused by name."""
    if arrays.framework_of(x) == "torch" and not hasattr(x, "dtype"):  # (a torch.Size, say)
        raise TypeError(f"{name}: expected an array or a tensor, got {type(x).__name__}")
    arrays.check_torch_dtype(name, x)
    try:
        return arrays.query_to_numpy(x) if name == "q" else arrays.to_numpy(x)
    except (RuntimeError, NotImplementedError) as exc:  # PyTorch's refusal of a tensor (a sign bit, the
        # meta device), naming nothing; a gradient is no reason: the copy detaches it
        arrays.refused((name,), (x,), exc, grad=False)
    except (ValueError, TypeError) as exc:
        if str(exc).startswith(f"{name}: "):  # the conversion's own check, already by name
            raise
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got a {type(x).__name__} NumPy cannot "
                        f"read as one ({exc})") from None


def host_tensors_as_arrays(names, xs):
    """``xs`` with each PyTorch tensor replaced by its NumPy array (``_host_array``: zero
    copy, a bfloat16 or float8 ``q`` widened) where every array of ``xs`` is on the host:
    the GPU path takes host tensors as it takes NumPy arrays, copied to the device, with
    NumPy results. Beside device arrays they stay as they are, refused by name as PyTorch
    refuses tensors of two devices in one call."""
    if any(arrays.is_device_array(x) for x in xs):
        return tuple(xs)
    return tuple(_host_array(name, x) if arrays.framework_of(x) == "torch" else x for name, x in zip(names, xs))


def _taken_as_arrays(names, xs, readers=()):
    """(``host_tensors_as_arrays(names, xs)``, ``readers`` with every tensor the conversion
    copied (a bfloat16 or float8 q widened, a negated view resolved) added as (name, tensor):
    ``out=`` is kept apart from the caller's memory, not only from the copies'."""
    taken = host_tensors_as_arrays(names, xs)
    copied = tuple((name, x) for name, x, t in zip(names, xs, taken)
                   if t is not x and arrays.byte_extent(t) != arrays.byte_extent(x))
    return taken, tuple(readers) + copied


def score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k, *,
               backend="auto", precision="fast", return_scores=False, physical=False,
               validate=True, out=None, workspace=None, stream=None, workspace_budget=None, _cu_seqlens=None,
               _readers=()):
    """Score every visible key of each query and return the top-k entries, highest first.

    ``I[t, s] = sum_h w[t, h] * max(0, q[t, h, :] . k[s, :])`` over the entries
    ``0 <= s < valid_lens[t]`` of query ``t``, entry ``s`` living in physical block
    ``block_table[t, s // E]``, slot ``s % E`` of the NVFP4 key pool.

    Parameters
    ----------
    q : float32, float16, bfloat16 or float8_e4m3fn (T, H, D)
                                     index queries, D a multiple of 32. A narrower device query
                                     is read as it lies (no cast kernel, no copy); bfloat16 and
                                     float8_e4m3fn as PyTorch tensors, or NumPy arrays of
                                     ml_dtypes' types. float8_e4m3fn is the form of DeepSeek's
                                     FP8 indexer queries, their per-head scale folded into w.
                                     Every value of each is a float32 value, scored exactly as
                                     that float32 query would be.
    w : float32 (T, H)               per-token, per-head weights
    keys_fp4 : uint8 (P, E, D/2)     packed E2M1 codes of the pool
    key_scale : uint8 (P, E, D/16)   float8_e4m3fn block scales
    key_gscale : float32 (P,)        global decode scale of each physical block (> 0)
    block_table : int32 (T, L)       logical -> physical block, per query token
    valid_lens : int32 (T,)          entries visible to each query, 0 <= n <= L*E
    top_k : int                      1 <= top_k <= indexer.MAX_TOP_K
    backend : 'auto' | 'numpy' | 'cuda'
        'auto' runs on the GPU when CuPy sees one of compute capability 8.0 or newer
        (or the inputs live on a GPU), else NumPy. An older GPU is refused by name.
    precision : 'fast' | 'exact'
        'fast' (the GPU default) runs the dot products on fp16 tensor cores with exact keys
        and fp16-rounded queries (per-entry error <= 2**-11 of the score's magnitude);
        'exact' is the FP32 path (<= 1e-6). The NumPy backend is always exact (float64).
    return_scores : also return the float32 scores (T, top_k), -inf at padding.
    physical : return pool slots ``block_table[t, s // E] * E + s % E`` instead of ``s``.
    validate : run the argument checks (cheap, but they synchronise with the device);
        switch off in a hot loop once the inputs are known good. The NumPy backend always
        validates (there is no device to synchronise with).
    out : None, int32 (T, top_k), or with ``return_scores`` a pair (int32 (T, top_k),
        float32 (T, top_k)): C-contiguous arrays the result is written into, of the
        result's framework and device (NumPy for the NumPy backend and host inputs, PyTorch
        CPU tensors among them; on the GPU a PyTorch CUDA tensor for PyTorch inputs, a CuPy
        array for CuPy, JAX (whose arrays are immutable) or other DLPack CUDA inputs,
        written zero-copy).
        The call then returns ``out`` itself and allocates no result arrays. ``out`` must
        not share memory with an input or between its pair (ValueError naming it; on the
        GPU a check ``validate=False`` skips with the value checks, ~4-8 us of host time).
    workspace : None or ``indexer.Workspace``: device scratch memory owned by the caller
        instead of CuPy's pool, so the call can be captured in a CUDA graph (see
        ``indexer.workspace``). The NumPy backend accepts and ignores it.
    stream : None, a CuPy stream, a ``cudaStream_t`` pointer (int), a ``torch.cuda.Stream``
        or an object with ``__cuda_stream__``: where the GPU work runs. None: PyTorch's
        current stream when the inputs are PyTorch tensors, else CuPy's current stream.
        The NumPy backend checks and ignores it.
    workspace_budget : None or int: bytes of device scratch (scores, the select's buffers)
        a GPU call may take; query rows are scored and selected in runs that fit it, and a
        larger budget means fewer, larger runs (fewer launches and kernel tails). At least
        one row a run whatever the budget. None: 64 MiB for ``score_topk``, 256 MiB for
        ``score_topk_ragged`` (prefill-chunk: 3% faster than at 64 MiB, docs/performance.md
        v28). The NumPy backend checks and ignores it.

    Returns
    -------
    indices : int32 (T, top_k), highest score first, ties to the lower index, -1 padding;
        NumPy for NumPy inputs and PyTorch CPU tensors, CuPy for CuPy and other DLPack CUDA
        inputs, PyTorch for PyTorch CUDA tensors, JAX for JAX arrays.
    scores : float32 (T, top_k), only with ``return_scores``.
    With ``out``: ``out`` itself, filled.

    ``_cu_seqlens`` and ``_readers`` are ``score_topk_ragged``'s: the offsets of grouped rows,
    and (name, array) pairs of its own arguments that ``out`` must not overlap either.
    """
    _check_call(precision, workspace, workspace_budget, stream, return_scores=return_scores, physical=physical,
                validate=validate)
    inputs = (q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens)
    chosen = _pick_backend(backend, inputs)
    if chosen == "numpy":
        host = [_host_array(name, x) for name, x in zip(_NAMES, inputs)]
        cu = None if _cu_seqlens is None else arrays.to_numpy(_cu_seqlens)  # names a grouped call's rows
        prob = _validate.check_score_topk(*host, top_k, values=True, cu_seqlens=cu)
        targets = None if out is None else outbuf.check_host(out, prob.T, prob.top_k, return_scores)
        if targets is not None:  # the result is written after it is computed, but into the caller's inputs
            # the caller's own arrays' memory: a host copy (a bfloat16 or float8 tensor's
            # widened q, a negated view resolved) shares none with what out would overwrite
            named = [(name, arrays.byte_extent(x) or arrays.byte_extent(h)) for name, x, h in zip(_NAMES, inputs, host)]
            named += [(name, arrays.byte_extent(x)) for name, x in _readers]
            outbuf.check_apart(targets, return_scores, named)
        result = reference.checked_score_topk(*host, int(top_k), return_scores=return_scores, physical=physical)
        if targets is None:
            return result
        for target, value in zip(targets, result if return_scores else (result,)):
            target[...] = value
        return outbuf.returned(out, return_scores)
    from . import cuda_ops  # noqa: PLC0415  (needs CuPy; imported only for the GPU path)

    if arrays.any_torch(inputs):  # gpu-only: PyTorch host tensors go as NumPy arrays do
        inputs, _readers = _taken_as_arrays(_NAMES, inputs, _readers)
    return cuda_ops.score_topk(*inputs, top_k, precision=precision, return_scores=return_scores,  # gpu-only
                               physical=physical, validate=validate, out=out, workspace=workspace, stream=stream,
                               workspace_budget=workspace_budget, _cu_seqlens=_cu_seqlens, _readers=_readers)


def score_topk_ragged(q, w, keys_fp4, key_scale, key_gscale, block_table, cu_seqlens_q, valid_lens, top_k, *,
                      backend="auto", precision="fast", return_scores=False, physical=False, validate=True,
                      out=None, workspace=None, stream=None, workspace_budget=None):
    """``score_topk`` for query tokens grouped by sequence, as in varlen attention.

    The tokens of sequence b are rows ``cu_seqlens_q[b] : cu_seqlens_q[b+1]`` of ``q``,
    ``w`` and ``valid_lens``, and all read ``block_table[b]``: prefill and chunked prefill
    (thousands of tokens of one sequence, each with its causal length, see
    ``indexer.causal_lens``) and multi-token decode (2-4 draft tokens per request).

    Parameters
    ----------
    q : float32, float16, bfloat16 or float8_e4m3fn (T, H, D); w : float32 (T, H); keys_fp4, key_scale,
        key_gscale : the pool (as ``score_topk``)
    block_table : int32 (B, L)       logical -> physical block, per sequence
    cu_seqlens_q : int32 (B+1,)      query row offsets: 0 = cu[0] <= cu[1] <= ... <= cu[B] = T
    valid_lens : int32 (T,)          entries visible to each query token
    top_k, backend, precision, return_scores, physical, validate, out, workspace, stream,
    workspace_budget :
        as ``score_topk`` (``physical`` indices go through the token's sequence's block
        table; with a workspace the per-token block table is built in it too, so the call
        allocates nothing on the GPU; the budget's default here is 256 MiB)

    Returns the same as ``score_topk``: int32 (T, top_k) indices (and float32 scores).
    """
    _check_call(precision, workspace, workspace_budget, stream, return_scores=return_scores, physical=physical,
                validate=validate)
    kwargs = dict(precision=precision, return_scores=return_scores, physical=physical,
                  validate=validate, out=out, workspace=workspace, workspace_budget=workspace_budget)
    args = (q, w, keys_fp4, key_scale, key_gscale, block_table, cu_seqlens_q, valid_lens, top_k)
    if _pick_backend(backend, args[:-1]) == "cuda":  # gpu-only
        held = ()
        if arrays.any_torch(args[:-1]):  # PyTorch host tensors go as NumPy arrays do
            taken, held = _taken_as_arrays(_NAMES[:6] + ("cu_seqlens_q", "valid_lens"), args[:-1])
            args = (*taken, top_k)
        # the per-token table is built on the call's device and stream, like the launch
        # (the table is the workspace's too: its turn covers both)
        with streams.using(stream, args[:-1]) as run_on, turn_of(workspace):
            return _ragged(*args, stream=run_on, on_gpu=True, ordered=streams.on_torch_stream(args[:-1]),
                           held=held, **kwargs)
    return _ragged(*args, stream=stream, backend=backend, **kwargs)


def _ragged(q, w, keys_fp4, key_scale, key_gscale, block_table, cu_seqlens_q, valid_lens, top_k,
            on_gpu=False, ordered=False, held=(), **kwargs):
    """``on_gpu``: the CUDA path (inside ``streams.using``), which checks the values of
    ``cu_seqlens_q`` together with the other values (one device launch and read-back,
    ``validate.check_score_topk``; the per-token table built before that check is safe for
    any offsets: clamped) and calls ``cuda_ops.score_topk`` itself, the public layer's
    checks done once above. ``ordered``: as ``arrays.to_cupy`` takes it (the CUDA path runs
    on PyTorch's current stream). ``held``: (name, tensor) pairs of the caller's host tensors
    that reach here as copies (``_taken_as_arrays``), which ``out=`` must not overlap either."""
    if arrays.framework_of(cu_seqlens_q) == "torch" or arrays.framework_of(block_table) == "torch":
        # gpu-only (PyTorch is not a dependency): device views for the CUDA path, host arrays
        # for NumPy's (the per-token table is built where the call runs)
        cu_seqlens_q, block_table = (arrays.to_cupy(x, ordered=ordered) if on_gpu else _host_array(name, x)
                                     for name, x in (("cu_seqlens_q", cu_seqlens_q), ("block_table", block_table)))
    # out= must not overlap these (nor the caller's tensors ``held`` that were copied on the way)
    readers = (("block_table", block_table), ("cu_seqlens_q", cu_seqlens_q)) + tuple(held)
    if on_gpu:  # gpu-only
        cu_seqlens_q, block_table = _grouping_beside_device(cu_seqlens_q, block_table)
    T = _validate.query_rows(q)  # before the offsets are checked against it; the call checks the rest
    # the NumPy backend always checks values (the GPU path checks them with the others)
    _validate.check_groups(cu_seqlens_q, block_table, T, values=not on_gpu)
    per_token = ragged.expand_block_table(block_table, cu_seqlens_q, T, workspace=kwargs["workspace"])
    call = score_topk
    if on_gpu:  # gpu-only
        from . import cuda_ops  # noqa: PLC0415  (needs CuPy)

        call = cuda_ops.score_topk
    # the GPU path pairs consecutive rows of one sequence so they share each key tile
    return call(q, w, keys_fp4, key_scale, key_gscale, per_token, valid_lens, top_k, _cu_seqlens=cu_seqlens_q,
                _readers=readers, **kwargs)


def _grouping_beside_device(cu_seqlens_q, block_table):  # gpu-only
    """The grouping's NumPy array beside a CuPy one, copied to that one's device, as the call
    copies every NumPy array beside device arrays (a GPU ``KeyPool``'s table with NumPy
    offsets: the README's grouped snippet). It is checked as the NumPy backend checks it
    first (dtype, rank, C order, alignment), so the copy puts nothing in order unasked; two
    arrays on one side are returned as they are (their own checks follow)."""
    pair = {"cu_seqlens_q": cu_seqlens_q, "block_table": block_table}
    host = [name for name, x in pair.items() if isinstance(x, np.ndarray)]
    device = [x for x in pair.values() if arrays.is_cupy(x)]
    if len(host) == 1 and device:
        name = host[0]
        _validate.check_grouping_array(name, pair[name])
        with arrays.cupy().cuda.Device(device[0].data.device_id):
            pair[name] = arrays.to_cupy(pair[name])
    return pair["cu_seqlens_q"], pair["block_table"]
