"""``out=``: caller-owned result arrays, for steps that allocate nothing.

``out`` is the int32 (T, top_k) indices array, or with ``return_scores=True`` the pair
``(indices, scores)`` with float32 (T, top_k) scores. The arrays belong to the framework
the result would have: NumPy for the NumPy backend and for host inputs on the GPU; for
device inputs the framework of ``q`` (CuPy for CuPy, a PyTorch CUDA tensor for PyTorch;
CuPy for JAX, whose arrays are immutable; CuPy or the same library for other DLPack
arrays), on ``q``'s device. They must be C-contiguous and must not overlap the inputs or
each other (``check_apart``: the kernels would read what they write, and the caller's
inputs would change).
The GPU writes into them through zero-copy CuPy views; the call returns ``out`` itself.
"""

from __future__ import annotations

import numpy as np

from . import arrays

__all__ = ["OUT_DTYPES", "OUT_DTYPE_NAMES", "split", "check_host", "device_views", "check_apart", "check_apart_extents",
           "extents", "returned"]

_WANT = {"numpy": "a NumPy array", "cupy": "a CuPy array", "torch": "a PyTorch CUDA tensor"}


def split(out, return_scores: bool):
    """(indices, scores or None) from ``out``; TypeError naming ``out`` when its structure
    does not match ``return_scores``."""
    pair = isinstance(out, (tuple, list))
    if return_scores:
        if not pair or len(out) != 2:
            raise TypeError("out: expected a pair (indices, scores) with return_scores=True, got "
                            + (f"a {type(out).__name__} of {len(out)}" if pair else type(out).__name__))
        return out[0], out[1]
    if pair:
        raise TypeError(f"out: expected one int32 (T, top_k) array (a pair only with return_scores=True), "
                        f"got a {type(out).__name__}")
    return out, None


# out's dtypes (indices, scores) as dtype objects: compared by identity first, named without
# NumPy's slow ``.name`` lookups on the hot path (~3 us each, Python code in NumPy 2)
OUT_DTYPES = (np.dtype(np.int32), np.dtype(np.float32))
OUT_DTYPE_NAMES = tuple(d.name for d in OUT_DTYPES)  # named once here (prepared.py compares them too)


def _wrong_array(name, x, dtype, shape):
    """The error for ``out`` array ``x`` of the wrong dtype or shape: TypeError where its
    dtype is wrong (as for any input of a wrong type, semantics.md), else ValueError."""
    error = TypeError if arrays.dtype_name(x) != np.dtype(dtype).name else ValueError
    return error(f"{name}: expected {np.dtype(dtype).name} of shape (T, top_k) = {shape}, "
                 f"got {x.dtype} of shape {tuple(x.shape)}")


def _check(name, x, dtype, shape):
    """dtype, shape, contiguity and (NumPy) writeability of a NumPy or CuPy array."""
    if (x.dtype is not dtype and x.dtype != dtype) or tuple(x.shape) != shape:  # (builtin dtypes: singletons)
        raise _wrong_array(name, x, dtype, shape)
    if not arrays.c_contiguous(x):
        raise ValueError(f"{name}: expected a C-contiguous array")
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError(f"{name}: expected a writeable array, got a read-only one")
    arrays.check_element_aligned(name, x)


def _names(return_scores):
    return ("out[0]", "out[1]") if return_scores else ("out", None)


def check_host(out, T: int, top_k: int, return_scores: bool):
    """``out`` for a NumPy result: (indices, scores or None) NumPy arrays, checked."""
    parts = split(out, return_scores)
    for name, x, dtype in zip(_names(return_scores), parts, OUT_DTYPES):
        if name is None:
            continue
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: expected a NumPy array (the result here is NumPy), got {type(x).__name__}")
        _check(name, x, dtype, (T, top_k))
    return parts


def device_views(out, like, T: int, top_k: int, return_scores: bool, device_id: int, ordered=False):  # gpu-only
    """``out`` for a device result of inputs like ``like`` (``q``): zero-copy CuPy views
    (indices, scores or None) on ``device_id``, checked; ``ordered`` as ``arrays.to_cupy``
    takes it."""
    want = arrays.framework_of(like)
    views = []
    parts = split(out, return_scores)
    for name, x, dtype, dtype_name in zip(_names(return_scores), parts, OUT_DTYPES, OUT_DTYPE_NAMES):
        if name is None:
            views.append(None)
            continue
        kind = arrays.framework_of(x)
        ok = (kind == want) if want in _WANT else (kind == "cupy" or (kind == "other" and arrays.is_device_array(x)))
        if not ok or not arrays.is_device_array(x):
            expected = _WANT.get(want, "a CuPy array (JAX arrays are immutable)" if want == "jax"
                                 else "a CuPy array (or a device array of q's library)")
            raise TypeError(f"{name}: expected {expected} like q, got {type(x).__name__}")
        if arrays.dtype_name(x) != dtype_name:  # before a conversion that may fail with no name
            raise _wrong_array(name, x, dtype, (T, top_k))
        try:
            view = arrays.to_cupy(x, ordered=ordered)
        except (RuntimeError, BufferError) as exc:  # DLPack's refusal of a tensor, naming nothing
            arrays.refused((name,), (x,), exc)
        _check(name, view, dtype, (T, top_k))
        if view.data.device_id != device_id:
            raise ValueError(f"{name}: expected an array on cuda:{device_id} (where q is), got cuda:{view.data.device_id}")
        views.append(view)
    return tuple(views)


def check_apart_extents(outs, inputs):
    """ValueError naming the first ``out`` array whose memory overlaps an input's or the
    other ``out`` array's: the kernels would read what they write and the caller's input
    would be changed. ``outs``, ``inputs``: (name, (first byte, one past the last)) each,
    an extent None where it is unknown or empty (never overlapping)."""
    for i, (name, extent) in enumerate(outs):
        if extent is None:
            continue
        for other, held in (*inputs, *outs[:i]):
            if held is not None and extent[0] < held[1] and held[0] < extent[1]:
                raise ValueError(f"{name}: expected memory of its own, got an array overlapping {other}")


def check_apart(parts, return_scores: bool, inputs):
    """``check_apart_extents`` for the checked ``out`` arrays ``parts`` (indices, scores or
    None) and ``inputs``: (name, extent) pairs, an extent as ``extents`` or
    ``arrays.byte_extent`` gives it."""
    outs = []
    for name, x in zip(_names(return_scores), parts):
        if name is not None:  # C-contiguous (checked): device views by their pointers
            outs.append((name, arrays.byte_extent(x) if isinstance(x, np.ndarray) else _span(x.data.ptr, x.nbytes)))
    check_apart_extents(outs, inputs)


def extents(named):
    """(name, extent) of each (name, array) pair of C-contiguous NumPy or CuPy arrays (the
    call's checked inputs: ~0.2 us an array where ``arrays.byte_extent`` takes ~1)."""
    return [(name, arrays.byte_extent(x) if isinstance(x, np.ndarray) else _span(x.data.ptr, x.nbytes))
            for name, x in named if x is not None]


def _span(start, nbytes):
    return (start, start + nbytes) if nbytes else None


def returned(out, return_scores: bool):
    """What a call given ``out`` returns: ``out`` itself (a list pair as a tuple)."""
    if return_scores and isinstance(out, list):
        return tuple(out)
    return out
