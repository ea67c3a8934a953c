"""The one set of argument checks every entry point shares.

Each failure raises ``ValueError`` (or ``TypeError`` for a wrong type) whose message
starts with the argument's name and says what was expected. The checks are cheap
(shapes, dtypes, and reductions over the small int32 tables and the (P,) scales); on
device arrays the value checks run as one kernel (``indexer.device_checks``) whose result
the host reads back once: that synchronisation is why a hot loop may switch them off.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import arrays

__all__ = ["MAX_TOP_K", "MAX_HEADS", "MAX_HEAD_DIM", "MAX_ROW_ENTRIES", "Problem", "check_score_topk", "check_top_k",
           "check_cu_seqlens", "check_groups", "check_lens_within", "query_rows", "check_flag"]

#: largest supported ``top_k``
MAX_TOP_K = 4096
#: largest supported number of heads H
MAX_HEADS = 128
#: largest supported head dimension D (a multiple of 32)
MAX_HEAD_DIM = 256
#: largest supported row, L * E entries: 2**31 less a margin, so that the kernels' 32-bit
#: row arithmetic (tile counts rounded up, loops stepping by a block of threads) cannot wrap
MAX_ROW_ENTRIES = 2**31 - 2**20


class Problem(NamedTuple):
    """The integers that shape one score + top-k call (a named tuple: built on every call,
    in 0.3 us where a frozen dataclass took 0.8, and hashed as the launch plan's key)."""

    T: int  # query tokens
    H: int  # heads
    D: int  # head dim
    P: int  # physical blocks in the pool
    E: int  # entries per block
    L: int  # logical blocks per block-table row
    top_k: int
    q_dtype: str = "float32"  # the query's element type (arrays.QUERY_DTYPES): the kernels' instances

    @property
    def max_len(self) -> int:
        """Most entries a row can see: L * E."""
        return self.L * self.E


def _place(x):
    """Where array ``x`` lives: -1 for the host (NumPy), else its CUDA device number
    (``data.device_id``: 0.04 us, where ``device.id`` builds a Device object, 0.11)."""
    return -1 if isinstance(x, np.ndarray) else x.data.device_id


def _kind(x) -> str:
    if arrays.is_cupy(x):
        return f"cuda:{x.data.device_id}"
    if isinstance(x, np.ndarray):
        return "cpu"
    return type(x).__name__


# the arguments' dtypes as dtype objects: a comparison with a scalar type converts it each time
_FLOAT32, _UINT8, _INT32 = np.dtype(np.float32), np.dtype(np.uint8), np.dtype(np.int32)


def _check_array(name, x, dtype, ndim, xp):
    if not (isinstance(x, np.ndarray) or arrays.is_cupy(x)):
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(x).__name__}")
    if dtype is not None and x.dtype is not dtype and x.dtype != dtype:  # (builtin dtypes are singletons)
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype).name}, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    if not arrays.c_contiguous(x):
        raise ValueError(f"{name}: expected a C-contiguous array")
    arrays.check_element_aligned(name, x)


def _check_shape(name, x, expected):
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}, got {tuple(x.shape)}")


def check_flag(name, value) -> None:
    """TypeError naming ``name`` unless ``value`` is a bool (NumPy's too): a truthy string or
    None would silently pick a mode."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {type(value).__name__} {value!r}")


def check_top_k(top_k) -> int:
    if isinstance(top_k, (bool, np.bool_)) or not isinstance(top_k, (int, np.integer)):
        raise TypeError(f"top_k: expected an int, got {type(top_k).__name__}")
    if not 1 <= int(top_k) <= MAX_TOP_K:
        raise ValueError(f"top_k: expected 1 <= top_k <= {MAX_TOP_K}, got {int(top_k)}")
    return int(top_k)


def _query_dtype(q, bits_of):
    """The query's dtype name: ``bits_of`` ("bfloat16" or "float8_e4m3fn") where ``q`` is the
    CuPy view of such a query's bits (from ``arrays.query_to_cupy``), else ``q``'s own;
    TypeError unless one of ``arrays.QUERY_DTYPES``."""
    if bits_of is not None:
        bits = arrays.BITS_DTYPES.get(bits_of)
        if bits is None:
            raise TypeError(f"q: a {bits_of} query is not read as bits (only {', '.join(arrays.BITS_DTYPES)} are)")
        if not arrays.is_cupy(q) or q.dtype != bits:
            raise TypeError(f"q: expected the {bits} CuPy bits of a {bits_of} query, got {q.dtype} "
                            f"({type(q).__name__}) as {bits_of}")
        return bits_of
    name = arrays.dtype_name(q)
    if name not in arrays.QUERY_DTYPES:
        raise TypeError(f"q: expected dtype float32, float16, bfloat16 or float8_e4m3fn, got {name}")
    return name


def check_score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k,
                     *, values: bool = True, cu_seqlens=None, q_bits_of=None, first_row: int = 0,
                     first_seq: int = 0) -> Problem:
    """Check the arguments of ``score_topk`` and return the problem's shape.

    ``q`` may be float32, float16, bfloat16 or float8_e4m3fn (the last two NumPy's through
    ml_dtypes); ``q_bits_of``: "bfloat16" or "float8_e4m3fn" where ``q`` is the CuPy view of
    such a query's bits (uint16 or uint8, ``arrays.query_to_cupy``), else None.

    ``values=False`` keeps the shape, dtype and device checks and skips the reductions
    over values (valid_lens range, block ids, global scales), which are the only ones
    that synchronise with a device. ``cu_seqlens`` (int32 (B+1,), shape already checked by
    ``check_cu_seqlens(..., values=False)``): the offsets of ``score_topk_ragged``, whose
    values are then checked first, on device arrays in the same launch as the others.
    ``first_row``, ``first_seq``: the caller's numbers of query row 0 and (grouped) of
    sequence 0 here (rows of a larger input checked a run at a time), for the messages that
    name a row.
    """
    top_k = check_top_k(top_k)
    if isinstance(q, np.ndarray) or arrays.is_cupy(q):  # (else refused by name below)
        q_dtype = _query_dtype(q, q_bits_of)
    args = {
        "q": (q, None, 3),  # its dtype checked above
        "w": (w, _FLOAT32, 2),
        "keys_fp4": (keys_fp4, _UINT8, 3),
        "key_scale": (key_scale, _UINT8, 3),
        "key_gscale": (key_gscale, _FLOAT32, 1),
        "block_table": (block_table, _INT32, 2),
        "valid_lens": (valid_lens, _INT32, 1),
    }
    for name, (x, dtype, ndim) in args.items():
        _check_array(name, x, dtype, ndim, None)
    if len({_place(x) for x, _, _ in args.values()}) != 1:  # the message's strings only on failure
        where = ", ".join(f"{k} on {_kind(x)}" for k, (x, _, _) in args.items())
        raise ValueError(f"q: all arrays must be on one device, got {where}")

    T, H, D = (int(n) for n in q.shape)
    P, E, half_d = (int(n) for n in keys_fp4.shape)
    L = int(block_table.shape[1])
    if T < 1:
        raise ValueError(f"q: expected at least one query token, got shape {tuple(q.shape)}")
    if not 1 <= H <= MAX_HEADS:
        raise ValueError(f"q: expected 1 <= H <= {MAX_HEADS} heads, got H = {H}")
    if D % 32 or not 32 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"q: head dim D must be a multiple of 32 in [32, {MAX_HEAD_DIM}], got D = {D}")
    _check_shape("w", w, (T, H))
    if half_d * 2 != D:
        raise ValueError(f"keys_fp4: expected last dimension D/2 = {D // 2} for D = {D}, got shape {tuple(keys_fp4.shape)}")
    if P < 1 or E < 1:
        raise ValueError(f"keys_fp4: expected at least one block of at least one entry, got shape {tuple(keys_fp4.shape)}")
    _check_shape("key_scale", key_scale, (P, E, D // 16))
    _check_shape("key_gscale", key_gscale, (P,))
    if block_table.shape[0] != T:
        raise ValueError(f"block_table: expected {T} rows (one per query token), got shape {tuple(block_table.shape)}")
    _check_shape("valid_lens", valid_lens, (T,))
    if L < 1:
        raise ValueError(f"block_table: expected at least one column, got shape {tuple(block_table.shape)}")
    if P * E >= 2**31:
        raise ValueError(f"keys_fp4: P * E = {P * E} pool entries exceeds the int32 range of physical indices")
    if L * E > MAX_ROW_ENTRIES:
        raise ValueError(f"block_table: L * E = {L * E} entries per row exceeds the supported {MAX_ROW_ENTRIES} "
                         "(2**31 - 2**20)")
    prob = Problem(T=T, H=H, D=D, P=P, E=E, L=L, top_k=top_k, q_dtype=q_dtype)
    if values:
        _check_values(prob, key_gscale, block_table, valid_lens, cu_seqlens, first_row, first_seq)
    return prob


def _device_failures(**arrays_and_sizes):  # gpu-only
    from . import device_checks  # noqa: PLC0415  (imports CuPy: device arrays only)

    return device_checks.first_failures(**arrays_and_sizes)


def _check_values(prob: Problem, key_gscale, block_table, valid_lens, cu_seqlens=None, first_row=0, first_seq=0):
    xp = arrays.module_of(valid_lens)
    if xp is not np:  # gpu-only: one launch and one read-back; the reductions below only word a failure
        failed = _device_failures(valid_lens=valid_lens, max_len=prob.max_len, key_gscale=key_gscale,
                                  block_table=block_table, E=prob.E, cu_seqlens=cu_seqlens, T=prob.T)
        if not any(i is not None for i in failed):
            return
    if cu_seqlens is not None:
        _check_offsets(cu_seqlens, prob.T)
    lo, hi = int(valid_lens.min()), int(valid_lens.max())
    if lo < 0 or hi > prob.max_len:
        t = int(xp.argmax((valid_lens < 0) | (valid_lens > prob.max_len)))
        raise ValueError(
            f"valid_lens: expected 0 <= n <= L*E = {prob.max_len}, got values in [{lo}, {hi}] "
            f"(the first out of range: {int(valid_lens[t])} at row {t + first_row})"
        )
    if not bool(xp.all(xp.isfinite(key_gscale) & (key_gscale > 0))):
        bad = int(xp.argmax(~(xp.isfinite(key_gscale) & (key_gscale > 0))))
        raise ValueError(f"key_gscale: expected finite values > 0, got {float(key_gscale[bad])} at block {bad}")
    # Block ids of visible blocks only: ids past a row's visible blocks are never read.
    visible_blocks = (valid_lens.astype(xp.int64) + prob.E - 1) // prob.E
    visible = xp.arange(prob.L)[None, :] < visible_blocks[:, None]
    bad = visible & ((block_table < 0) | (block_table >= prob.P))
    if bool(xp.any(bad)):
        t, j = (int(i) for i in np.unravel_index(int(xp.argmax(bad)), bad.shape))
        # a grouped call's table here is per query row: name the caller's row, its sequence
        row = f"row {t + first_row}" if cu_seqlens is None else \
            f"row {int(np.searchsorted(arrays.to_numpy(cu_seqlens), t, side='right')) - 1 + first_seq} " \
            f"(for query row {t + first_row})"
        raise ValueError(
            f"block_table: expected block ids in [0, {prob.P}) for visible entries, "
            f"got {int(block_table[t, j])} at {row}, logical block {j}"
        )
    if xp is not np:  # gpu-only: the kernel and the reductions disagree (a bug, not the input)
        raise RuntimeError(f"the device value checks failed at {failed}, the reductions found nothing")


def check_cu_seqlens(cu_seqlens_q, block_table, T: int, *, values: bool = True) -> int:
    """Check ``cu_seqlens_q`` (int32 (B+1,)) against ``block_table`` (B, L) and T query rows;
    returns B. ``values`` also checks cu[0] == 0, cu[B] == T and that it never decreases
    (a reduction: a host synchronisation on device arrays)."""
    check_grouping_array("cu_seqlens_q", cu_seqlens_q)
    check_grouping_array("block_table", block_table)
    B = int(block_table.shape[0])
    if cu_seqlens_q.shape[0] != B + 1:
        raise ValueError(f"cu_seqlens_q: expected shape ({B + 1},) for {B} block-table rows, got {tuple(cu_seqlens_q.shape)}")
    if _kind(cu_seqlens_q) != _kind(block_table):
        raise ValueError(f"cu_seqlens_q: expected the device of block_table ({_kind(block_table)}), got {_kind(cu_seqlens_q)}")
    if values:
        if arrays.module_of(cu_seqlens_q) is not np and _device_failures(cu_seqlens=cu_seqlens_q, T=T)[3] is None:
            return B  # gpu-only
        _check_offsets(cu_seqlens_q, T)
    return B


def check_grouping_array(name, x) -> None:
    """``cu_seqlens_q`` (int32 (B+1,)) or ``block_table`` (int32 (B, L)) alone: dtype, rank,
    C order and element alignment (``check_cu_seqlens`` checks both so; the GPU path also checks
    a host one so before copying it to the device beside the other). The table as score_topk's
    per-token table: the GPU path's expansion kernel reads it as it lies (a copy into order
    would come from CuPy's pool even with a workspace, outside a CUDA graph's memory)."""
    _check_array(name, x, _INT32, 1 if name == "cu_seqlens_q" else 2, None)


def query_rows(q) -> int:
    """T, the rows of query ``q`` (T, H, D), which a grouped call counts before the other
    checks (its offsets end at T): TypeError or ValueError naming ``q`` where it is no
    array or has not three dimensions."""
    shape = getattr(q, "shape", None)
    if shape is None or isinstance(q, np.generic):
        raise TypeError(f"q: expected a NumPy or CuPy array (or a GPU tensor), got {type(q).__name__}")
    if len(shape) != 3:
        raise ValueError(f"q: expected 3 dimensions, got shape {tuple(shape)}")
    return int(shape[0])


def check_lens_within(valid_lens, seq_lens, prefix=""):
    """A grouped pool call's int32 ``valid_lens`` (T,) against its rows' sequences' lengths
    ``seq_lens`` (NumPy int (T,)): ValueError naming ``valid_lens`` (after ``prefix``, a file's
    name) for the first row that would see past its sequence, reading slots never written
    to it. Lengths of another dtype or shape are left to the call's checks, which refuse
    them by name."""
    lens = arrays.to_numpy(valid_lens)
    if not isinstance(lens, np.ndarray) or lens.dtype != np.int32 or lens.shape != seq_lens.shape:
        return
    over = np.flatnonzero(lens > seq_lens)
    if over.size:
        t = int(over[0])
        raise ValueError(f"{prefix}valid_lens: row {t} sees {int(lens[t])} entries, but its sequence holds "
                         f"{int(seq_lens[t])}")


def check_groups(cu_seqlens_q, block_table, T: int, *, values: bool = True) -> int:
    """``check_cu_seqlens`` for a grouped call, which needs at least one sequence (a
    block-table row to read): returns B >= 1, ValueError naming ``block_table`` for B = 0."""
    B = check_cu_seqlens(cu_seqlens_q, block_table, T, values=values)
    if B == 0:
        raise ValueError("block_table: expected at least one sequence (row), got shape (0, L)")
    if block_table.shape[1] < 1:
        raise ValueError(f"block_table: expected at least one column, got shape {tuple(block_table.shape)}")
    return B


def _check_offsets(cu_seqlens_q, T: int):
    """The values of ``cu_seqlens_q`` (shape checked): cu[0] == 0, cu[B] == T, never
    decreasing (reductions: a host synchronisation on device arrays)."""
    xp = arrays.module_of(cu_seqlens_q)
    first, last = int(cu_seqlens_q[0]), int(cu_seqlens_q[-1])
    if first != 0 or last != T:
        raise ValueError(f"cu_seqlens_q: expected offsets from 0 to T = {T}, got {first} .. {last}")
    if cu_seqlens_q.shape[0] > 1 and bool(xp.any(cu_seqlens_q[1:] < cu_seqlens_q[:-1])):
        raise ValueError("cu_seqlens_q: expected non-decreasing offsets")
