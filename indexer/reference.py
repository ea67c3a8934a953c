"""The NumPy float64 implementation: the contract (the README's "Storage layout",
"Precision" and return rules) in executable form.

Meant to be trusted by reading: keys are gathered through the block table and decoded
bit-exactly, every score is computed in float64, and the selection is a stable sort by
(score descending, index ascending) over the entries whose score is not NaN.
"""

from __future__ import annotations

import numpy as np

from . import nvfp4

__all__ = ["row_keys", "row_scores", "key_groups", "select_top_k", "to_physical", "score_topk", "score_topk_ragged"]


def row_keys(keys_fp4, key_scale, key_gscale, block_table_row, n, start=0):
    """Decoded keys of logical entries ``start .. n-1`` of one row, float32 (n - start, D).

    Entry ``s`` lives in physical block ``block_table_row[s // E]``, slot ``s % E``.
    """
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
    exactly where the codes, scales and (float32) global scale are byte for byte the same.
    Such entries score exactly equal in every precision, so the tie rule orders them by index."""
    return _groups_and_firsts(keys_fp4, key_scale, key_gscale, block_table_row, n)[0]


def _groups_and_firsts(keys_fp4, key_scale, key_gscale, block_table_row, n):
    """(``key_groups``' numbering (n,), the lowest entry of each group (groups,)), int64."""
    E = keys_fp4.shape[1]
    s = np.arange(n)
    b, e = block_table_row[s // E], s % E
    gscale_bytes = np.ascontiguousarray(key_gscale[b], dtype=np.float32).view(np.uint8).reshape(-1, 4)
    rows = np.concatenate([keys_fp4[b, e], key_scale[b, e], gscale_bytes], axis=1)
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
    """Physical pool slots ``block_table[t, s // E] * E + s % E`` of logical ``indices``; -1 stays -1."""
    t = np.arange(indices.shape[0])[:, None]
    safe = np.where(indices >= 0, indices, 0)
    phys = block_table[t, safe // E].astype(np.int64) * E + safe % E
    return np.where(indices >= 0, phys, -1).astype(np.int32)


def score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k,
               *, return_scores=False, physical=False):
    """Reference score + top-k on NumPy arrays (shapes and dtypes as ``indexer.score_topk``).

    Returns int32 indices (T, top_k) and, with ``return_scores``, float32 scores (T, top_k).
    """
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
            scores[t] = sc.astype(np.float32)
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
    T = q.shape[0]
    per_token = np.repeat(block_table, np.diff(cu_seqlens_q.astype(np.int64)), axis=0)
    assert per_token.shape[0] == T
    return score_topk(q, w, keys_fp4, key_scale, key_gscale, per_token, valid_lens, top_k,
                      return_scores=return_scores, physical=physical)
