"""The NumPy float64 implementation: the contract (the README's "Storage layout",
"Precision" and return rules) in executable form.

Meant to be trusted by reading: keys are gathered through the block table and decoded
bit-exactly, every score is computed in float64, and the selection is a stable sort by
(score descending, index ascending) over the entries whose score is not NaN.

``score_topk`` and ``score_topk_ragged`` check their arguments as ``indexer.score_topk``
does (its NumPy backend calls them checked); the building blocks check what would otherwise
read outside a row or give a silently wrong answer (lengths, visible block ids, ``chunk``,
``top_k``, ``E``), each error naming the argument.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import nvfp4, validate as _validate

__all__ = ["row_keys", "row_scores", "key_groups", "select_top_k", "to_physical", "score_topk", "score_topk_ragged",
           "checked_score_topk"]


def _count(name, v, low, high):
    """``v`` as an int in [low, high]; TypeError / ValueError naming ``name``."""
    if isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "iu":  # a 0-d integer array
        v = v.item()
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if not low <= v <= high:
        raise ValueError(f"{name}: expected {low} <= {name} <= {high}, got {v}")
    return int(v)


def _check_pool(keys_fp4, key_scale, key_gscale):
    """The pool arrays' types and shapes (NumPy arrays: uint8 (P, E, D/2) codes, uint8
    (P, E, D/16) scales, real (P,) global scales): TypeError / ValueError naming the array.
    Returns D."""
    for name, x, ndim, want in (("keys_fp4", keys_fp4, 3, "uint8"), ("key_scale", key_scale, 3, "uint8"),
                                ("key_gscale", key_gscale, 1, "real")):
        ok = isinstance(x, np.ndarray) and (x.dtype == np.uint8 if want == "uint8" else x.dtype.kind in "iuf")
        if not ok:
            raise TypeError(f"{name}: expected a {want} NumPy array, got {getattr(x, 'dtype', type(x).__name__)}")
        if x.ndim != ndim:
            raise ValueError(f"{name}: expected {ndim} dimensions, got shape {x.shape}")
    P, E, half_d = keys_fp4.shape
    D = 2 * half_d
    if P < 1 or E < 1 or D % 32:
        raise ValueError(f"keys_fp4: expected shape (P, E, D/2) with P, E >= 1 and D a multiple of 32, "
                         f"got {keys_fp4.shape}")
    if key_scale.shape != (P, E, D // 16):
        raise ValueError(f"key_scale: expected shape {(P, E, D // 16)} for keys_fp4 of shape {keys_fp4.shape}, "
                         f"got {key_scale.shape}")
    if key_gscale.shape != (P,):
        raise ValueError(f"key_gscale: expected shape ({P},), got {key_gscale.shape}")
    return D


def _check_query(q_t, w_t, D, lead=()):
    """A query's shapes against the pool's D: ``q_t`` lead + (H, D), ``w_t`` lead + (H,);
    ValueError naming the array (``lead``: (T,) for a batch of queries)."""
    q_shape, w_shape = np.shape(q_t), np.shape(w_t)
    k = len(lead)
    if len(q_shape) != k + 2 or q_shape[:k] != lead or q_shape[-1] != D or q_shape[-2] < 1:
        raise ValueError(f"q: expected shape {lead + ('H', D)} for the pool's D = {D}, got {q_shape}")
    if w_shape != q_shape[:-1]:
        raise ValueError(f"w: expected shape {q_shape[:-1]} (one weight a head), got {w_shape}")


def _check_row(keys_fp4, key_gscale, block_table_row, n, start=0):
    """A row's ``n`` visible entries (from ``start``) and the blocks holding them: ValueError
    / TypeError naming ``n``, ``start``, ``block_table_row`` or ``key_gscale`` where they
    leave the row or the pool, or a visible block's global scale is not finite and > 0.
    Returns n."""
    row = np.asarray(block_table_row)
    if row.ndim != 1 or row.dtype.kind not in "iu":
        raise TypeError(f"block_table_row: expected a 1-D integer array, got {row.dtype} {row.shape}")
    P, E = keys_fp4.shape[:2]
    n = _count("n", n, 0, row.shape[0] * E)
    _count("start", start, 0, n)
    visible = row[: -(-n // E)]
    if visible.size and (int(visible.min()) < 0 or int(visible.max()) >= P):
        raise ValueError(f"block_table_row: expected the ids of the {visible.size} blocks holding entries in [0, {P})")
    g = key_gscale[visible].astype(np.float32)  # (decoded as its float32 value)
    if not np.all(np.isfinite(g) & (g > 0)):
        raise ValueError("key_gscale: expected finite values > 0 for the blocks holding visible entries")
    return n


def row_keys(keys_fp4, key_scale, key_gscale, block_table_row, n, start=0):
    """Decoded keys of logical entries ``start .. n-1`` of one row, float32 (n - start, D).

    Entry ``s`` lives in physical block ``block_table_row[s // E]``, slot ``s % E``.
    """
    _check_pool(keys_fp4, key_scale, key_gscale)
    n = _check_row(keys_fp4, key_gscale, block_table_row, n, start)
    return _entry_keys(keys_fp4, key_scale, key_gscale, block_table_row, np.arange(start, n))


def _entry_keys(keys_fp4, key_scale, key_gscale, block_table_row, s):
    """Decoded keys of the logical entries ``s`` (m,) of one row, float32 (m, D)."""
    E = keys_fp4.shape[1]
    blocks = block_table_row[s // E]
    slots = s % E
    return nvfp4.dequantize(keys_fp4[blocks, slots], key_scale[blocks, slots], key_gscale[blocks])


_KEY_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: each step a bijection of 64-bit words


def key_groups(keys_fp4, key_scale, key_gscale, block_table_row, n):
    """Entries ``0 .. n-1`` of one row numbered by their stored key: int64 (n,), equal
    exactly where the codes, scales and (float32) global scale are byte for byte the same
    but for zeros: a -0 code as +0, and any codes under a scale of +-0 (``_canonical_bytes``).
    Such entries decode to the same values with the same scales, so they score exactly
    equal in every precision, and the tie rule orders them by index."""
    _check_pool(keys_fp4, key_scale, key_gscale)
    n = _check_row(keys_fp4, key_gscale, block_table_row, n)
    return _groups_and_firsts(keys_fp4, key_scale, key_gscale, block_table_row, n)[0]


def _canonical_bytes(codes, scales):
    """Codes (n, D/2) and scales (n, D/16) uint8 with their zeros in one form: a -0 element
    (code 8) as +0 (code 0), and under a scale of +-0 (E4M3 0x00, 0x80) every code 0 and the
    scale 0x00: each decodes to the same value (+-0, which no score tells apart) as before."""
    lo, hi = codes & 0xF, codes >> 4
    zero_scale = (scales & 0x7F) == 0
    under_zero = np.repeat(zero_scale, 8, axis=1)  # a scale covers 16 elements: 8 code bytes
    lo = np.where((lo == 8) | under_zero, 0, lo)
    hi = np.where((hi == 8) | under_zero, 0, hi)
    return (lo | (hi << 4)).astype(np.uint8), np.where(zero_scale, 0, scales).astype(np.uint8)


def _groups_and_firsts(keys_fp4, key_scale, key_gscale, block_table_row, n):
    """(``key_groups``' numbering (n,), the lowest entry of each group (groups,)), int64."""
    E = keys_fp4.shape[1]
    s = np.arange(n)
    b, e = block_table_row[s // E], s % E
    gscale_bytes = np.ascontiguousarray(key_gscale[b], dtype=np.float32).view(np.uint8).reshape(-1, 4)
    rows = np.concatenate([*_canonical_bytes(keys_fp4[b, e], key_scale[b, e]), gscale_bytes], axis=1)
    rows = np.pad(rows, ((0, 0), (0, -rows.shape[1] % 8)))
    # one 64-bit hash a key, grouped; kept only if every key equals its group's first
    words = rows.view(np.uint64)
    h = np.zeros(n, dtype=np.uint64)
    for j in range(words.shape[1]):
        h = (h ^ words[:, j]) * _KEY_HASH_MULT
        h ^= h >> np.uint64(29)
    first, group = np.unique(h, return_index=True, return_inverse=True)[1:]
    group = group.ravel().astype(np.int64)
    if not np.array_equal(rows, rows[first[group]]):  # a hash collision: group the bytes themselves
        first, group = np.unique(rows.view(np.dtype((np.void, rows.shape[1]))).ravel(), return_index=True,
                                 return_inverse=True)[1:]
        group = group.ravel().astype(np.int64)
    return group, first.astype(np.int64)


def _first_of_key(keys_fp4, key_scale, key_gscale, block_table_row, n):
    """int64 (n,): the lowest of entries ``0 .. n-1`` with the same stored key as each."""
    group, first = _groups_and_firsts(keys_fp4, key_scale, key_gscale, block_table_row, n)
    return first[group]


def row_scores(q_t, w_t, keys_fp4, key_scale, key_gscale, block_table_row, n, chunk=16384):
    """float64 scores (n,) of one query: ``sum_h w[h] * max(0, q[h] . k[s])``; NaN propagates.
    Entries with identical stored keys get bit-identical scores."""
    _check_query(q_t, w_t, _check_pool(keys_fp4, key_scale, key_gscale))
    n = _check_row(keys_fp4, key_gscale, block_table_row, n)
    _count("chunk", chunk, 1, 2**62)
    first = _first_of_key(keys_fp4, key_scale, key_gscale, block_table_row, n)
    return _scores_by_key(q_t, w_t, lambda s: _entry_keys(keys_fp4, key_scale, key_gscale, block_table_row, s),
                          first, n, chunk)


def _scores_by_key(q_t, w_t, keys_at, first, n, chunk=16384):
    """Scores (n,) of entries ``0 .. n-1``, each stored key scored once and its score given
    to every entry holding it. BLAS may sum a column's products in an order that depends on
    the column's place in the matrix, so identical keys scored side by side can come out an
    ulp apart and break the tie rule. ``keys_at(s)``: decoded float32 keys (m, D) of the
    entries ``s``; ``first``: ``_first_of_key`` of at least ``n`` entries."""
    first = first[:n]  # a prefix: each entry's first is at or before it
    distinct = np.flatnonzero(first == np.arange(n))
    scores = _scores(q_t, w_t, lambda start, stop: keys_at(distinct[start:stop]), distinct.size, chunk)
    return scores[np.searchsorted(distinct, first)]


def _scores(q_t, w_t, keys_of, n, chunk=16384):
    """``row_scores`` for keys given by ``keys_of(start, stop)``: decoded float32 keys of
    entries start .. stop-1, (stop - start, D)."""
    q64 = q_t.astype(np.float64)
    w64 = w_t.astype(np.float64)
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        k = keys_of(start, stop).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            dots = q64 @ k.T  # (H, chunk)
            relu = np.where(dots < 0, 0.0, dots)  # keeps NaN, unlike np.maximum's sibling fmax
            out[start:stop] = w64 @ relu
    return out


def select_top_k(scores, top_k):
    """Indices (top_k,) int32 of the highest non-NaN scores, highest first, ties to the lower
    index, padded with -1; and their scores (top_k,) float64, -inf at padding."""
    scores = np.asarray(scores)
    if scores.ndim != 1 or scores.dtype.kind not in "iuf":
        raise TypeError(f"scores: expected a 1-D array of real numbers, got {scores.dtype} {scores.shape}")
    top_k = _count("top_k", top_k, 0, 2**31 - 1)
    n = scores.shape[0]
    idx = np.arange(n)
    keep = ~np.isnan(scores)
    cand_idx = idx[keep]
    cand = scores[keep] + 0.0  # -0.0 and +0.0 are equal scores
    order = np.lexsort((cand_idx, -cand))[:top_k]
    out_idx = np.full(top_k, -1, dtype=np.int32)
    out_sc = np.full(top_k, -np.inf, dtype=np.float64)
    out_idx[: order.size] = cand_idx[order]
    out_sc[: order.size] = cand[order]
    return out_idx, out_sc


def to_physical(indices, block_table, E):
    """Physical pool slots ``block_table[t, s // E] * E + s % E`` of logical ``indices`` (T, k);
    -1 stays -1. ValueError / TypeError naming the argument where an index leaves its row or
    a slot leaves the int32 range."""
    E = _count("E", E, 1, 2**31 - 1)
    indices, block_table = np.asarray(indices), np.asarray(block_table)
    if indices.ndim != 2 or indices.dtype.kind not in "iu":
        raise TypeError(f"indices: expected a 2-D integer array (T, top_k), got {indices.dtype} {indices.shape}")
    if block_table.ndim != 2 or block_table.dtype.kind not in "iu" or block_table.shape[0] != indices.shape[0]:
        raise TypeError(f"block_table: expected a 2-D integer array of {indices.shape[0]} rows, "
                        f"got {block_table.dtype} {block_table.shape}")
    if indices.size and (int(indices.min()) < -1 or int(indices.max()) >= block_table.shape[1] * E):
        raise ValueError(f"indices: expected -1 or entries below L * E = {block_table.shape[1] * E}")
    t = np.arange(indices.shape[0])[:, None]
    safe = np.where(indices >= 0, indices, 0)
    phys = np.where(indices >= 0, block_table[t, safe // E].astype(np.int64) * E + safe % E, -1)
    if phys.size and (int(phys.min()) < -1 or int(phys.max()) > 2**31 - 1):
        raise ValueError("block_table: a selected entry's slot (block * E + entry) leaves [0, 2**31)")
    return phys.astype(np.int32)


def score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k,
               *, return_scores=False, physical=False):
    """Reference score + top-k on NumPy arrays (shapes as ``indexer.score_topk``; dtypes
    looser: any integer tables and lengths, a float64 ``key_gscale`` taken as its float32
    value as ``nvfp4.dequantize`` takes it). ``top_k``, the flags, the rows' shapes, their
    lengths and the block ids of their visible entries are checked: ValueError / TypeError
    naming the argument.

    Returns int32 indices (T, top_k) and, with ``return_scores``, float32 scores (T, top_k).
    """
    top_k = _validate.check_top_k(top_k)
    _validate.check_flag("return_scores", return_scores)
    _validate.check_flag("physical", physical)
    T = _validate.query_rows(q)
    for name, x, ndim in (("w", w, 2), ("block_table", block_table, 2), ("valid_lens", valid_lens, 1)):
        if np.ndim(x) != ndim or np.shape(x)[0] != T:
            raise ValueError(f"{name}: expected {ndim} dimensions and {T} rows (one a query), got shape {np.shape(x)}")
    _check_query(q, w, _check_pool(keys_fp4, key_scale, key_gscale), (T,))
    for t in range(T):
        _check_row(keys_fp4, key_gscale, block_table[t], valid_lens[t])
    return checked_score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k,
                              return_scores=return_scores, physical=physical)


def checked_score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k,
                       *, return_scores=False, physical=False):
    """``score_topk`` of arguments already checked (``indexer.score_topk``'s NumPy backend)."""
    T = q.shape[0]
    indices = np.full((T, top_k), -1, dtype=np.int32)
    scores = np.full((T, top_k), -np.inf, dtype=np.float32)
    for first, stop in _runs_of_equal_rows(block_table):
        # rows of one block table (the tokens of a sequence) decode their keys once, for the
        # longest of them; a lone row decodes a chunk at a time
        shared = None
        if stop - first > 1:
            longest = int(valid_lens[first:stop].max())
            shared = row_keys(keys_fp4, key_scale, key_gscale, block_table[first], longest)
            shared_first = _first_of_key(keys_fp4, key_scale, key_gscale, block_table[first], longest)
        for t in range(first, stop):
            n = int(valid_lens[t])
            if n == 0:
                continue
            if shared is not None:
                s = _scores_by_key(q[t], w[t], shared.__getitem__, shared_first, n)
            else:
                s = row_scores(q[t], w[t], keys_fp4, key_scale, key_gscale, block_table[t], n)
            indices[t], sc = select_top_k(s, top_k)
            # a score past float32's range returns as +-inf; a negative one too small for
            # float32 rounds to -0, returned as +0 like every zero score (+ 0 folds it)
            with np.errstate(over="ignore"):
                scores[t] = sc.astype(np.float32) + np.float32(0.0)
    if physical:
        indices = to_physical(indices, block_table, keys_fp4.shape[1])
    return (indices, scores) if return_scores else indices


def _runs_of_equal_rows(block_table):
    """(first, stop) of each run of consecutive equal rows of ``block_table`` (T, L)."""
    T = block_table.shape[0]
    differs = np.any(block_table[1:] != block_table[:-1], axis=1) if T > 1 else np.zeros(0, dtype=bool)
    bounds = np.concatenate([[0], np.flatnonzero(differs) + 1, [T]])
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def score_topk_ragged(q, w, keys_fp4, key_scale, key_gscale, block_table, cu_seqlens_q, valid_lens, top_k,
                      *, return_scores=False, physical=False):
    """Reference for queries grouped by sequence: query t of sequence b (cu_seqlens_q[b] <= t
    < cu_seqlens_q[b+1]) reads block_table[b]; otherwise exactly ``score_topk``."""
    T = _validate.query_rows(q)
    cu = cu_seqlens_q
    if (isinstance(cu, np.ndarray) and cu.dtype.kind in "iu" and cu.dtype != np.int32
            and (cu.size == 0 or 0 <= int(cu.min()) <= int(cu.max()) < 2**31)):
        cu_seqlens_q = cu.astype(np.int32)  # any integer offsets, as the reference takes its tables
    _validate.check_groups(cu_seqlens_q, block_table, T)
    per_token = np.repeat(block_table, np.diff(cu_seqlens_q.astype(np.int64)), axis=0)
    return score_topk(q, w, keys_fp4, key_scale, key_gscale, per_token, valid_lens, top_k,
                      return_scores=return_scores, physical=physical)
