"""A GPU ``KeyPool``'s writes: every block an append touches, written by one kernel launch.

``KeyPool`` plans an append on the host (which rows go to which block, after how many of its
entries); ``write_blocks`` hands that plan to ``kernels/key_write.cu``, one CTA a block,
which applies the pool's global-scale rule (a fresh or all-zero block takes its scale from
the new rows; a block whose new rows exceed its capacity grows and re-expresses its
entries) and quantizes the rows with the NumPy form's exact roundings. So a GPU pool's bytes
equal a host pool's after the same appends, and a decode step's keys for B sequences cost
one launch instead of a few dozen array operations per sequence.
"""

from __future__ import annotations

import numpy as np

from . import _jit

__all__ = ["THREADS", "write_blocks"]

#: threads a CTA (kernels/key_write.cu's kThreads)
THREADS = 128


def write_blocks(keys_fp4, key_scale, key_gscale, items, keys):  # gpu-only
    """Write rows of ``keys`` into the pool's blocks, on CuPy's current stream.

    keys_fp4 : CuPy uint8 (P, E, D/2), key_scale : uint8 (P, E, D/16), key_gscale : float32
        (P,): the pool's arrays, C-contiguous, written in place.
    items : flat list of ints, four an item (block, used, first row, count): rows
        ``first .. first + count - 1`` of ``keys`` go after the first ``used`` entries of ``block``. Blocks are distinct,
        ``used + count <= E``, ``count >= 1``; a block with ``used == 0`` is a fresh one
        (its entries past the new rows are zeroed).
    keys : CuPy float32 (n, D), C-contiguous, finite, within the pool's largest storable key.
    """
    if not items:
        return
    import cupy as cp  # noqa: PLC0415  (GPU path only)

    E, half = int(keys_fp4.shape[1]), int(keys_fp4.shape[2])
    table = cp.asarray(np.array(items, dtype=np.int32))  # the kernel reads an item as an int4
    kernel = _jit.get_kernel("key_write.cu", "key_write_kernel")
    kernel((len(items) // 4,), (THREADS,),
           (table, keys, np.int32(2 * half), np.int32(E), keys_fp4, key_scale, key_gscale))
