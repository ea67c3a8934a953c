"""Validation's value checks over CuPy arrays: one kernel launch and one read-back.

``indexer.validate`` checks values (``valid_lens`` in range, finite positive global scales,
visible block ids in ``[0, P)``, ``cu_seqlens_q`` offsets) with NumPy-style reductions; on
device arrays each of those is a CuPy launch and a host synchronisation, ~0.5 ms a call in
all. ``kernels/check_values.cu`` runs them all in one pass; only a failed check goes back to
the reductions, to word its message. Imported only for device arrays (it imports CuPy).
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from . import _jit

__all__ = ["first_failures", "CHECKS"]

#: the checks, in the order of ``first_failures``' result
CHECKS = ("valid_lens", "key_gscale", "block_table", "cu_seqlens_q")

_THREADS = 256


def _pointer(x):
    return 0 if x is None else x


def first_failures(*, valid_lens=None, max_len=0, key_gscale=None, block_table=None, E=1,
                   cu_seqlens=None, T=0):  # gpu-only
    """For each of ``CHECKS``: None when it passed (or was not asked for), else the smallest
    offending flat position (a row of ``valid_lens``, a block of ``key_gscale``, ``t * L + j``
    of ``block_table``, an index of ``cu_seqlens``). Arrays: C-contiguous CuPy ``valid_lens``
    int32 (T,), ``key_gscale`` float32 (P,), ``block_table`` int32 (T, L) (checked only with
    ``valid_lens``: the blocks each row sees, ``E`` entries a block), ``cu_seqlens`` int32
    (B + 1,) against ``T`` rows. Runs on the current stream and waits for it."""
    rows = 0 if valid_lens is None else int(valid_lens.shape[0])
    P = 0 if key_gscale is None else int(key_gscale.shape[0])
    L = 1 if block_table is None else int(block_table.shape[1])
    B = 0 if cu_seqlens is None else int(cu_seqlens.shape[0]) - 1
    found = cp.zeros(len(CHECKS), dtype=cp.uint64)
    # x: a row's visible blocks (at most L); y: rows; enough CTAs for the 1-D checks' lengths
    gx = max(1, min(16, -(-L // _THREADS)))
    gy = max(1, min(max(rows, -(-max(P, B) // (gx * _THREADS))), 65535, max(1, 1024 // gx)))
    kernel = _jit.get_kernel("check_values.cu", "check_values_kernel")
    kernel((gx, gy), (_THREADS,),
           (_pointer(valid_lens), np.int32(rows), np.int32(max_len), _pointer(key_gscale), np.int32(P),
            _pointer(block_table), np.int32(L), np.int32(E), _pointer(cu_seqlens), np.int32(B), np.int32(T), found))
    raw = found.get()  # the one synchronisation
    return tuple(None if v == 0 else int(~np.uint64(v)) for v in raw)
