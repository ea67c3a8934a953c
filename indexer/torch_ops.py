"""PyTorch operators ``torch.ops.indexer.score_topk``, ``score_topk_ragged`` and
``write_keys``, for models compiled by ``torch.compile`` or captured in CUDA graphs.

``torch.compile`` cannot trace into CuPy: a model that calls ``indexer.score_topk`` breaks its
graph there at every layer (and ``fullgraph=True`` refuses to compile it). Importing this
module (it needs PyTorch; nothing else in the package imports it) registers the calls as
custom operators with ``torch.library``: the compiler sees one opaque node per call, whose
outputs' shapes and dtypes the fake implementations below give, and runs the indexer there.

    import indexer.torch_ops as iops

    @torch.compile(fullgraph=True)
    def layer_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens):
        idx, scores = iops.score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table,
                                      valid_lens, 512, physical=True)
        return idx

Each call returns new tensors ``(indices, scores)``: int32 and float32 (T, top_k), on ``q``'s
device, exactly what ``indexer.score_topk(..., return_scores=True)`` returns. With ``out=``
(the indices tensor, or the pair) the wrappers call the mutating forms
``torch.ops.indexer.score_topk_out`` / ``score_topk_ragged_out`` instead, which write the
caller's tensors in place and make none (what an engine with its buffers kept from step to
step calls eagerly; under ``torch.compile`` the compiler's functionalization handles the
mutation). ``write_keys`` (``torch.ops.indexer.write_keys``) quantizes a step's keys into
the pool tensors in place, as ``indexer.write_keys`` does, and returns nothing.

* CUDA tensors take the CUDA path on PyTorch's current stream (the capture stream inside
  ``torch.cuda.graph`` or a compiled model's CUDA graphs), with ``validate=False`` unless
  asked for: the value checks read a result back to the host, which a captured graph
  cannot do. Scratch memory comes from one ``indexer.Workspace`` a device (``workspace()``),
  which grows on a call that needs more: run each shape once before a capture (PyTorch's
  warm-up iterations do; ``torch.compile(mode="reduce-overhead")`` runs them itself), or
  ``workspace(device).reserve(nbytes)``. Calls on several streams or threads take turns on
  that workspace (``Workspace.turn``): each waits for the one before, on the GPU; graphs
  replayed by the caller are the caller's to order.
* Unchecked CUDA calls of a signature met before (the tensors' shapes, dtypes, devices and
  contiguity, ``top_k`` and the keywords) run through an ``indexer.PreparedCall`` of it, made
  at the signature's second call on the operators' workspace and holding none of the
  tensors (16 kept): checked and planned once, launched from a CUDA graph where the same
  pointers come again. The answers are the public call's, bit for bit; such a call also
  refuses an ``out`` that overlaps its inputs (ValueError naming it), which an unchecked
  public call does not look for.
* CPU tensors take the NumPy reference (always validated), on zero-copy NumPy views.

Bad input raises the same ``ValueError`` / ``TypeError`` naming the argument as the public
calls do; a ``top_k`` out of range is refused while the graph is traced, by the fake
implementation, before anything runs.
"""

import numpy as np
import torch

if not hasattr(torch.library, "register_fake"):  # the fake implementations below need it (PyTorch 2.4)
    raise ImportError(f"indexer.torch_ops: needs PyTorch 2.4 or later (torch.library.register_fake), "
                      f"found {torch.__version__}")

from . import arrays, keywrite, ops, outbuf, validate as _validate  # noqa: E402
from .workspace import Workspace  # noqa: E402

__all__ = ["score_topk", "score_topk_ragged", "write_keys", "workspace"]

_WORKSPACES = {}  # CUDA device index -> the operators' Workspace there


def workspace(device=None) -> Workspace:
    """The ``Workspace`` the operators' calls on CUDA device ``device`` (an index, a
    ``torch.device`` or None for the current one) take their scratch memory from."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device}")
    index = device.index
    if index is None:
        index = torch.cuda.current_device()  # gpu-only
    ws = _WORKSPACES.get(index)
    if ws is None:  # one for every thread that asks first (setdefault is atomic)
        ws = _WORKSPACES.setdefault(index, Workspace())
    return ws


def _results(q, top_k):
    """Empty (indices, scores) of the call's shape on ``q``'s device."""
    if q.dim() != 3:  # before its rows are counted (the call checks the rest)
        raise ValueError(f"q: expected 3 dimensions, got shape {tuple(q.shape)}")
    T = q.shape[0]
    return (torch.empty((T, top_k), dtype=torch.int32, device=q.device),
            torch.empty((T, top_k), dtype=torch.float32, device=q.device))


def _call(public, tensors, top_k, precision, physical, validate, out=None):
    """``public`` (``ops.score_topk`` or ``ops.score_topk_ragged``) on ``tensors`` (their
    positional arrays), writing into ``out`` (an int32 indices tensor, or a pair of it and
    the float32 scores), or into new result tensors when it is None; returns what it wrote."""
    top_k = _validate.check_top_k(top_k)
    tensors = [t.detach() if t.requires_grad else t for t in tensors]  # DLPack refuses tensors that require grad
    callers_out = out is not None
    if out is None:
        out = _results(tensors[0], top_k)
    kwargs = dict(precision=precision, return_scores=isinstance(out, tuple), physical=physical)
    if tensors[0].is_cuda:  # gpu-only
        key = None if validate else _signature(public, tensors, top_k, kwargs, out)
        step = None if key is None else _PREPARED.get(key)
        if step is None:
            public(*tensors, top_k, backend="cuda", validate=validate, out=out,
                   workspace=workspace(tensors[0].device), **kwargs)
            if key is not None:
                _sighted(key, public, tensors, top_k, kwargs)
        elif public is ops.score_topk_ragged:  # its arrays' order: ... block_table, cu_seqlens_q, valid_lens
            step(*tensors[:6], tensors[7], cu_seqlens_q=tensors[6], out=out)
        else:
            step(*tensors, out=out)
    else:
        views, targets = _host_views(public, tensors), _host_out(out)
        if callers_out:  # apart from the tensors themselves: a bfloat16 or float8 q's view is a widened copy
            outs = out if isinstance(out, tuple) else (out,)
            names = ("out[0]", "out[1]") if isinstance(out, tuple) else ("out",)
            outbuf.check_apart_extents([(n, arrays.byte_extent(o)) for n, o in zip(names, outs)],
                                       [(n, arrays.byte_extent(t)) for n, t in zip(_names(public), tensors)])
        public(*views, top_k, backend="numpy", out=targets, **kwargs)
    return out


# The CUDA calls of a signature met before go through an ``indexer.PreparedCall`` of it: its
# checks and launch plan made once, its launches replayed from a CUDA graph where the same
# tensors' pointers come again (docs/performance.md v95). A signature's first call takes the
# public call, so shapes that change every call (an eager engine's batch) pay nothing for it.
# A signature: the tensors' shapes, dtypes, devices and contiguity, top_k and the keywords.
_PREPARED = {}  # signature -> its PreparedCall (the oldest dropped past _PREPARED_MAX)
_SIGHTED = {}  # signature -> public calls of it that went through, until its PreparedCall is made
_PREPARED_MAX = 16
_SIGHTED_MAX = 4096


def _signature(public, tensors, top_k, kwargs, out):  # gpu-only
    """What a PreparedCall fixes or checks by type of a call: each tensor's type, shape,
    dtype, device and contiguity, and out's types and grad flags (PreparedCall reads out by
    pointer). No lazy negation bit reaches here: the dispatcher resolves an input's, and
    refuses an out's, before the kernel."""
    outs = out if isinstance(out, tuple) else (out,)
    return (public, top_k, *kwargs.values(),
            tuple((type(t), t.shape, t.dtype, t.get_device(), t.is_contiguous()) for t in tensors),
            tuple((type(o), o.requires_grad) for o in outs))


def _sighted(key, public, tensors, top_k, kwargs):  # gpu-only
    """Count a public call of signature ``key`` that went through; at the second, make the
    signature's PreparedCall (on the operators' workspace, holding none of the tensors)."""
    seen = _SIGHTED.get(key, 0) + 1
    if len(_SIGHTED) >= _SIGHTED_MAX:
        _SIGHTED.clear()
    _SIGHTED[key] = seen
    if seen < 2:
        return
    # nothing made inside a caller's capture on the tensors' GPU (a grouped call's table
    # kernel, launched by the construction, would join the caller's graph)
    with torch.cuda.device(tensors[0].device):
        if torch.cuda.is_current_stream_capturing():
            return
    from .prepared import prepare  # noqa: PLC0415

    if public is ops.score_topk_ragged:
        arrays_, cu = (*tensors[:6], tensors[7]), tensors[6]
    else:
        arrays_, cu = tensors, None
    try:
        step = prepare(*arrays_, top_k, cu_seqlens_q=cu, validate=False, workspace=workspace(tensors[0].device),
                       **kwargs)
    except Exception:  # noqa: BLE001  (the call itself went through: its signature stays on the public call)
        _SIGHTED[key] = -_SIGHTED_MAX
        return
    step._keep_views = False  # nothing of the caller's kept alive between calls
    step._inputs_resolved = True  # the dispatcher resolves a negation bit before the kernel
    if len(_PREPARED) >= _PREPARED_MAX:
        try:  # the oldest (another thread may drop or add one meanwhile)
            del _PREPARED[next(iter(_PREPARED))]
        except (StopIteration, KeyError, RuntimeError):
            pass
    _PREPARED[key] = step
    _SIGHTED.pop(key, None)


def _host_out(out):
    """NumPy views of CPU result tensors (``out`` given to a CPU call)."""
    dtypes = "int32 indices and float32 scores"
    if isinstance(out, tuple):
        return tuple(_host_view(f"out[{i}]", t, dtypes) for i, t in enumerate(out))
    return _host_view("out", out, dtypes)


def _host_views(public, tensors):
    """NumPy views of a CPU call's input tensors."""
    return [_host_view(name, t, "a NumPy dtype (the README's argument table)") for name, t in zip(_names(public), tensors)]


def _host_view(name, t, dtypes):
    """The NumPy view of CPU tensor ``t``, argument ``name``; errors name it: a tensor on
    another device, or a dtype NumPy lacks (bfloat16, float8), ``dtypes`` saying what it expects."""
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a tensor on q's device (cpu), got {t.device}")
    try:  # (a bfloat16 or float8 query, which NumPy cannot hold, widened exactly)
        return arrays.query_to_numpy(t) if name == "q" else t.numpy()
    except TypeError as exc:
        raise TypeError(f"{name}: expected {dtypes}, got {t.dtype} ({exc})") from None
    except RuntimeError as exc:  # PyTorch's refusal (a negation bit, a gradient), naming nothing
        arrays.refused((name,), (t,), exc)


def _names(public):
    """The argument names of ``public``'s arrays, in order."""
    return ops._NAMES[:6] + ("cu_seqlens_q",) + ops._NAMES[6:] if public is ops.score_topk_ragged else ops._NAMES


# The operators are defined through torch.library's low-level API, as vLLM's
# direct_register_custom_op does: torch.library.custom_op's Python wrapper cost an eager
# batch-1 call +67 us of host time over score_topk, this form +29 (docs/performance.md v48).
# The _out forms write into the caller's tensors (mutable arguments, no results), which
# takes the two result allocations off each eager call.
_LIB = torch.library.Library("indexer", "DEF")  # noqa: TOR901  (the namespace's one definition)
_POOL = "Tensor q, Tensor w, Tensor keys_fp4, Tensor key_scale, Tensor key_gscale, Tensor block_table, "
_FLAGS = "str precision, bool physical, bool validate"
_OUT = "Tensor(a!) indices, Tensor(b!)? scores, "
for _name, _rows in (("score_topk", ""), ("score_topk_ragged", "Tensor cu_seqlens_q, ")):
    _LIB.define(f"{_name}({_POOL}{_rows}Tensor valid_lens, int top_k, {_FLAGS}) -> (Tensor, Tensor)")
    _LIB.define(f"{_name}_out({_POOL}{_rows}Tensor valid_lens, int top_k, {_OUT}{_FLAGS}) -> ()")


def _functional(public):
    """The functional operator's kernel for ``public``: its arrays, then top_k and the flags."""
    n = len(_names(public))

    def impl(*args):
        return _call(public, args[:n], *args[n:])
    return impl


def _mutating(public):
    """The _out operator's kernel for ``public``: its arrays, top_k, indices, scores (or
    None), then the flags."""
    n = len(_names(public))

    def impl(*args):
        top_k, indices, scores = args[n:n + 3]
        _call(public, args[:n], top_k, *args[n + 3:], out=indices if scores is None else (indices, scores))
    return impl


def _one_device(names, tensors):
    """ValueError naming the first of ``tensors`` on another device than the first. The
    fake implementations run for a real call too where one tensor is on PyTorch's meta
    device (the dispatcher takes the meta kernel then): its results would be left unfilled."""
    device = tensors[0].device
    for name, t in zip(names, tensors):
        if isinstance(t, torch.Tensor) and t.device != device:
            raise ValueError(f"{name}: expected a tensor on {names[0]}'s device ({device}), got {t.device}")


def _fake_of(public):
    """The functional operator's fake (meta) implementation for ``public``: the results'
    shapes, dtypes and device (its arrays, then top_k and the flags)."""
    names = _names(public)

    def fake(*args):
        _one_device(names, args[:len(names)])
        return _results(args[0], _validate.check_top_k(args[len(names)]))
    return fake


def _fake_out_of(public):
    """The _out operator's fake implementation for ``public``: nothing to make (``top_k``
    refused here while tracing when out of range)."""
    names = _names(public)

    def fake(*args):
        n = len(names)
        _one_device(names + ("out[0]", "out[1]"), args[:n] + args[n + 1:n + 3])
        _validate.check_top_k(args[n])
    return fake


for _public in (ops.score_topk, ops.score_topk_ragged):
    for _name, _impl, _fake_impl in ((_public.__name__, _functional(_public), _fake_of(_public)),
                                     (_public.__name__ + "_out", _mutating(_public), _fake_out_of(_public))):
        for _key in ("CPU", "CUDA"):
            _LIB.impl(_name, _impl, _key)
        # no gradient: autograd passes the operators by (their results never require grad)
        _LIB.impl(_name, torch.library.fallthrough_kernel, "Autograd")
        torch.library.register_fake(f"indexer::{_name}", _fake_impl, lib=_LIB)


def _dispatch(names, functional, mutating, tensors, top_k, flags, out):
    """Call the functional operator (new results) or, with ``out``, the _out one; returns
    the results or ``out`` itself. The arguments the operator's schema would convert or
    refuse in words of its own are checked first, by name (``names``: the tensors')."""
    _check_arguments(names, tensors, top_k, flags)
    out_names, out_tensors = (), ()
    if out is not None:
        pair = isinstance(out, (tuple, list))
        if pair and len(out) != 2:
            raise TypeError(f"out: expected the indices tensor or a pair (indices, scores), got {len(out)} items")
        out_names, out_tensors = (("out[0]", "out[1]"), tuple(out)) if pair else (("out",), (out, None))
        for name, t in zip(out_names, out_tensors):
            if not (isinstance(t, torch.Tensor) or (t is None and name == "out[1]")):  # (indices, None): no scores
                raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    try:
        if out is None:
            return functional(*tensors, top_k, *flags)
        mutating(*tensors, top_k, *out_tensors, *flags)
        return out
    except NotImplementedError as exc:  # no kernel for a layout (sparse, nested) or the meta device
        arrays.refused(names + out_names, tensors + out_tensors, exc, grad=False, sign=False)
    except RuntimeError as exc:  # a negated out the dispatch refuses (inputs come resolved and
        # detached: their errors are the call's own, passed on as they are)
        arrays.refused(out_names, out_tensors, exc)


def _check_arguments(names, tensors, top_k, flags):
    """TypeError / ValueError naming what the schema would convert silently (a bool or
    tensor ``top_k``, a truthy flag) or refuse in its own words (a tensor argument of
    another type, a precision of another type). The usual call passes by identity and type
    tests alone (an eager call's host time: docs/performance.md v96)."""
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    if type(top_k) is not int or not 1 <= top_k <= _validate.MAX_TOP_K:
        if (isinstance(top_k, (bool, np.bool_, torch.Tensor))
                or not isinstance(top_k, (int, np.integer, torch.SymInt))):
            raise TypeError(f"top_k: expected an int, got {type(top_k).__name__}")
        if isinstance(top_k, (int, np.integer)):  # (a traced SymInt is checked by the fake implementation)
            _validate.check_top_k(top_k)
    precision, physical, validate = flags
    if precision not in ops.PRECISIONS:
        raise ValueError(f"precision: expected one of {ops.PRECISIONS}, got {precision!r}")
    if type(physical) is not bool or type(validate) is not bool:
        _validate.check_flag("physical", physical)
        _validate.check_flag("validate", validate)


def score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k, *, precision="fast",
               physical=False, validate=False, out=None):
    """``torch.ops.indexer.score_topk``: ``indexer.score_topk`` on PyTorch tensors (shapes
    and dtypes as there), as one operator ``torch.compile`` keeps in its graph. Returns
    ``(indices, scores)``: int32 and float32 (T, top_k) tensors on ``q``'s device.
    ``validate``: the value checks on CUDA tensors (a host synchronisation, so never inside
    a captured graph); CPU tensors are always validated.
    ``out``: an int32 (T, top_k) indices tensor, or a pair of it and a float32 (T, top_k)
    scores tensor, on ``q``'s device, contiguous, written in place by
    ``torch.ops.indexer.score_topk_out`` and returned (no result tensor is made)."""
    return _dispatch(ops._NAMES, torch.ops.indexer.score_topk, torch.ops.indexer.score_topk_out,
                     (q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens), top_k,
                     (precision, physical, validate), out)


def score_topk_ragged(q, w, keys_fp4, key_scale, key_gscale, block_table, cu_seqlens_q, valid_lens, top_k, *,
                      precision="fast", physical=False, validate=False, out=None):
    """``torch.ops.indexer.score_topk_ragged``: ``indexer.score_topk_ragged`` (queries grouped
    by sequence, ``block_table`` (B, L), ``cu_seqlens_q`` (B+1,)) as one operator. Returns
    ``(indices, scores)``, or writes ``out``, as ``score_topk`` does."""
    return _dispatch(_names(ops.score_topk_ragged), torch.ops.indexer.score_topk_ragged,
                     torch.ops.indexer.score_topk_ragged_out,
                     (q, w, keys_fp4, key_scale, key_gscale, block_table, cu_seqlens_q, valid_lens), top_k,
                     (precision, physical, validate), out)


# write_keys: the pool tensors are mutable arguments, nothing is returned
_LIB.define("write_keys(Tensor keys, Tensor slots, Tensor(a!) keys_fp4, Tensor(b!) key_scale, "
            "Tensor(c!) key_gscale, bool validate) -> ()")


def _write_keys(keys, slots, keys_fp4, key_scale, key_gscale, validate):
    """The write_keys operator's kernel: ``indexer.write_keys`` on the tensors (CUDA: on
    PyTorch's current stream; CPU: the host form on NumPy views of the pool, written in place)."""
    pool = (keys_fp4, key_scale, key_gscale)
    for name, t in zip(("keys", "slots", "key_scale", "key_gscale"), (keys, slots, key_scale, key_gscale)):
        if t.device != keys_fp4.device:
            raise ValueError(f"{name}: expected a tensor on keys_fp4's device ({keys_fp4.device}), got {t.device}")
    keys = keys.detach() if keys.requires_grad else keys
    if keys_fp4.is_cuda:
        keywrite.write_keys(keys, slots, *pool, validate=validate)  # gpu-only
    else:
        views = [_host_view(name, t, "uint8 codes and scales and float32 global scales")
                 for name, t in zip(("keys_fp4", "key_scale", "key_gscale"), pool)]
        keywrite.write_keys(keys, slots, *views)


_WRITE_NAMES = ("keys_fp4", "keys", "slots", "key_scale", "key_gscale")


def _write_keys_fake(keys, slots, keys_fp4, key_scale, key_gscale, validate):
    """Nothing to make: the pool is written in place (the devices checked: see _one_device)."""
    _one_device(_WRITE_NAMES, (keys_fp4, keys, slots, key_scale, key_gscale))
    return None


for _key in ("CPU", "CUDA"):
    _LIB.impl("write_keys", _write_keys, _key)
_LIB.impl("write_keys", torch.library.fallthrough_kernel, "Autograd")
torch.library.register_fake("indexer::write_keys", _write_keys_fake, lib=_LIB)


def write_keys(keys, slots, keys_fp4, key_scale, key_gscale, *, validate=False):
    """``torch.ops.indexer.write_keys``: ``indexer.write_keys`` on PyTorch tensors (shapes and
    dtypes as there: keys float32, float16 or bfloat16 (N, D); slots int32 or int64 (N,), -1
    for a padding key; the pool's uint8 keys_fp4 (P, E, D/2) and key_scale (P, E, D/16) and
    float32 key_gscale (P,), written in place), as one operator ``torch.compile`` keeps in its
    graph. ``validate``: the value checks on CUDA tensors (a host synchronisation, so never
    inside a captured graph); CPU tensors are always checked. Returns None."""
    tensors = (keys_fp4, keys, slots, key_scale, key_gscale)
    for name, t in zip(_WRITE_NAMES, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    _validate.check_flag("validate", validate)
    try:
        torch.ops.indexer.write_keys(keys, slots, keys_fp4, key_scale, key_gscale, validate)
    except NotImplementedError as exc:  # no kernel for a layout (sparse, nested) or the meta device
        arrays.refused(_WRITE_NAMES, tensors, exc, grad=False, sign=False)
    except RuntimeError as exc:  # a negated or grad-requiring pool tensor (written in place; the keys
        # come resolved and detached: their errors are the call's own, passed on as they are)
        arrays.refused(_WRITE_NAMES[:1] + _WRITE_NAMES[3:], tensors[:1] + tensors[3:], exc)
