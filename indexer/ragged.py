"""Queries grouped by sequence, as in varlen attention: the tokens of sequence b are rows
``cu_seqlens_q[b] : cu_seqlens_q[b + 1]`` and share ``block_table[b]``.

Works on NumPy and CuPy arrays alike (the array module is taken from the input); the table
expansion runs without a host synchronisation on the device (``causal_lens`` reads the total
and the lengths' range back to check them).
"""

from __future__ import annotations

import numpy as np

from . import _jit, arrays, validate as _validate

__all__ = ["sequence_of_token", "expand_block_table", "causal_lens"]


def sequence_of_token(cu_seqlens_q, T: int):
    """int64 (T,): the sequence each query row belongs to, from int32 ``cu_seqlens_q`` (B+1,).

    Clamped to [0, B-1], so malformed offsets (when validation is off) can never index
    outside the block table.
    """
    xp = arrays.module_of(cu_seqlens_q)
    B = cu_seqlens_q.shape[0] - 1
    seq = xp.searchsorted(cu_seqlens_q, xp.arange(T, dtype=cu_seqlens_q.dtype), side="right") - 1
    return xp.clip(seq, 0, max(B - 1, 0)).astype(xp.int64)


def expand_block_table(block_table, cu_seqlens_q, T: int, *, workspace=None):
    """int32 (T, L): row t is the block table of query t's sequence (a gather, no host sync).

    On CuPy arrays one kernel (``kernels/ragged.cu``) writes it: into an
    ``indexer.Workspace`` when one is given (allocating nothing: CUDA-graph safe), else
    into a new array. On NumPy arrays a new array.
    """
    xp = arrays.module_of(block_table)
    if xp is np:
        return np.ascontiguousarray(block_table[sequence_of_token(cu_seqlens_q, T)])
    return _expand_on_device(block_table, cu_seqlens_q, T, workspace)  # gpu-only


def _expand_on_device(block_table, cu_seqlens_q, T, workspace):  # gpu-only
    cp = arrays.cupy()
    if block_table.dtype != np.int32:
        raise TypeError(f"block_table: expected dtype int32, got {block_table.dtype}")
    B, L = (int(n) for n in block_table.shape)
    if B < 1 and T * L:  # no row to copy from (NumPy's gather raises IndexError likewise)
        raise ValueError("block_table: expected at least one sequence (row), got shape (0, L)")
    device_id = block_table.data.device_id
    with cp.cuda.Device(device_id):  # the table's device, whichever is current
        table = cp.ascontiguousarray(block_table)  # a no-op for the usual contiguous table
        cu = cp.ascontiguousarray(cu_seqlens_q)
        if workspace is None:
            out = cp.empty((T, L), dtype=cp.int32)
        else:  # the view cut once a shape (Workspace.views: ~5 us of host time a call)
            out = workspace.views(("ragged", T, L), lambda: workspace.buffer(max(T * L * 4, 4), part="ragged")
                                  [: T * L * 4].view(cp.int32).reshape(T, L))
        if T * L:
            kernel = _jit.get_kernel("ragged.cu", "expand_block_table_kernel", device_id)
            kernel((T,), (128,), (table, cu, np.int32(B), np.int32(L), out))
    return out


def _offsets_array(cu_seqlens_q):
    """``causal_lens``' offsets as a NumPy or CuPy array: a list, tuple or PyTorch CPU tensor
    as a NumPy array (as the scoring calls take host tensors), a CUDA tensor or other
    DLPack device array as a CuPy view; TypeError naming ``cu_seqlens_q`` for what is none."""
    if isinstance(cu_seqlens_q, np.ndarray) or arrays.is_cupy(cu_seqlens_q):
        return cu_seqlens_q
    if isinstance(cu_seqlens_q, (list, tuple)):
        return arrays.as_array(np, cu_seqlens_q, "cu_seqlens_q")
    if arrays.framework_of(cu_seqlens_q) in ("torch", "jax", "other") and hasattr(cu_seqlens_q, "dtype"):
        on_device = arrays.is_device_array(cu_seqlens_q)
        # read in place on the device (a sign bit or a gradient is refused), copied on the host
        reason = arrays.torch_refusal(cu_seqlens_q, grad=on_device, sign=on_device)
        if reason is not None:
            raise TypeError(f"cu_seqlens_q: {reason}")
        return arrays.to_cupy(cu_seqlens_q) if on_device else arrays.to_numpy(cu_seqlens_q)
    raise TypeError(f"cu_seqlens_q: expected a NumPy or CuPy array, a list or a tensor, "
                    f"got {type(cu_seqlens_q).__name__}")


def _check_offsets(cu_seqlens_q):
    """``causal_lens``' offsets: a NumPy or CuPy array of integers (B+1,), from 0, never
    decreasing, totalling less than 2**31 rows (reductions: a host synchronisation on the device)."""
    if not (isinstance(cu_seqlens_q, np.ndarray) or arrays.is_cupy(cu_seqlens_q)):
        raise TypeError(f"cu_seqlens_q: expected a NumPy or CuPy array, got {type(cu_seqlens_q).__name__}")
    if cu_seqlens_q.dtype.kind not in "iu":
        raise TypeError(f"cu_seqlens_q: expected integers, got dtype {cu_seqlens_q.dtype}")
    if cu_seqlens_q.ndim != 1 or cu_seqlens_q.shape[0] < 1:
        raise ValueError(f"cu_seqlens_q: expected shape (B+1,), got {tuple(cu_seqlens_q.shape)}")
    last = int(cu_seqlens_q[-1])
    if not last < 2**31:
        raise ValueError(f"cu_seqlens_q: expected offsets from 0 to T < 2**31, got .. {last}")
    _validate._check_offsets(cu_seqlens_q, last)  # from 0, never decreasing (T is the last here)


def causal_lens(cu_seqlens_q, *, ratio: int = 4, context_lens=None):
    """DeepSeek-V4's causal visible lengths of compressed entries, int32 (T,).

    The i-th new query token of sequence b sits at absolute position
    ``p = context_lens[b] + i`` (``context_lens``: tokens of the sequence before its first
    query row, 0 by default) and sees the compressed entries ``j < (p + 1) // ratio``.

    Parameters
    ----------
    cu_seqlens_q : int (B+1,)     query row offsets of the sequences (0 first, never decreasing):
        a NumPy or CuPy array, a list, or a tensor (PyTorch's on the host as a NumPy array)
    ratio : int                    tokens pooled into one compressed entry (4 in V4's CSA)
    context_lens : None or int (B,)  tokens already in each sequence (cached prefix)

    Returns int32 (T,): NumPy for host offsets (lists and PyTorch CPU tensors too), CuPy for
    CuPy ones, a PyTorch CUDA tensor for one (and so on: the framework of a device array).
    """
    like = cu_seqlens_q
    cu_seqlens_q = _offsets_array(cu_seqlens_q)
    if isinstance(ratio, (bool, np.bool_)) or not isinstance(ratio, (int, np.integer)):
        raise TypeError(f"ratio: expected a positive int, got {type(ratio).__name__} {ratio!r}")
    if ratio < 1:
        raise ValueError(f"ratio: expected a positive int, got {ratio!r}")
    # the arithmetic below is int64's; a ratio past every position (< 2**62 + T) sees nothing
    # either way, so the largest int64 stands for any larger one
    ratio = min(int(ratio), 2**63 - 1)
    _check_offsets(cu_seqlens_q)
    xp = arrays.module_of(cu_seqlens_q)
    cu = cu_seqlens_q.astype(xp.int64)
    B = cu.shape[0] - 1
    T = int(cu[-1])
    seq = sequence_of_token(cu_seqlens_q, T)
    start = cu[:-1][seq]
    if context_lens is None:
        ctx = xp.zeros(T, dtype=xp.int64)
    else:
        context = arrays.as_array(xp, context_lens, "context_lens")
        if context.dtype.kind not in "iu" and not (context.size == 0 and B == 0):  # ([] of B = 0: float64)
            raise TypeError(f"context_lens: expected integers, got dtype {context.dtype}")
        if context.shape != (B,):
            raise ValueError(f"context_lens: expected shape ({B},), got {tuple(context.shape)}")
        if B and int(context.min()) < 0:
            raise ValueError("context_lens: expected values >= 0")
        if B and int(context.max()) >= min(2**31 * ratio, 2**62):  # lengths >= 2**31 (or int64 overflow)
            raise ValueError("context_lens: visible lengths exceed the int32 range")
        ctx = context.astype(xp.int64)[seq]
    position = ctx + xp.arange(T, dtype=xp.int64) - start
    lens = (position + 1) // ratio
    if T and int(lens.max()) >= 2**31:
        raise ValueError("context_lens: visible lengths exceed the int32 range")
    lens = lens.astype(xp.int32)
    if xp is not np and not arrays.is_cupy(like):  # gpu-only: a device tensor's lengths in its framework
        return arrays.wrap_like(lens, like)
    return lens
