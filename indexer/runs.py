"""A saved problem scored a run of query rows at a time (``indexer score``), so that the
working memory is a run's, not the file's: the runs, the arrays of each, their checks and
their calls.

A problem is the seven ``score_topk`` arrays on the host, as ``io.load_grouped_problem``
returns them: ``block_table`` (T, L) per token, or (B, L) per sequence beside the int32
offsets ``cu_seqlens_q`` (B+1,) of a grouped input.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import arrays, ops, ragged, validate

__all__ = ["Run", "runs_of", "sequences_of_rows", "run_arrays", "check_shapes", "check_runs", "score_runs"]


class Run(NamedTuple):
    """Query rows ``r0 .. r1 - 1`` of an input, scored by one call. For a grouped input also
    the sequences holding them, ``b0 .. b1 - 1``, and the rows' int32 offsets within the run
    (``cu_seqlens_q`` of the call, from 0 to r1 - r0); else ``b0 = b1 = 0``, ``offsets`` None."""
    r0: int
    r1: int
    b0: int
    b1: int
    offsets: np.ndarray | None


def runs_of(problem, cu_seqlens_q, chunk):
    """The runs of ``chunk`` query rows an input is checked and scored in, for a grouped
    input (host int32 offsets ``cu_seqlens_q`` (B+1,), checked) with each run's sequences
    (``sequences_of_rows``)."""
    T = int(problem[0].shape[0])  # >= 1 (check_shapes)
    runs = []
    for r0 in range(0, T, chunk):
        r1 = min(r0 + chunk, T)
        b0, b1, offsets = (0, 0, None) if cu_seqlens_q is None else sequences_of_rows(cu_seqlens_q, r0, r1)
        runs.append(Run(r0, r1, b0, b1, offsets))
    return runs


def sequences_of_rows(cu_seqlens_q, r0, r1):
    """The sequences of a grouped input's query rows ``r0 .. r1 - 1`` (host int32 offsets
    ``cu_seqlens_q`` (B+1,), 0 <= r0 < r1 <= T, checked): ``(b0, b1, offsets)``, sequences
    ``b0 .. b1 - 1`` holding them (those with no rows there left out at the ends) and the
    int32 (b1 - b0 + 1,) offsets of their rows within the run, from 0 to r1 - r0."""
    b0 = int(np.searchsorted(cu_seqlens_q, r0, side="right")) - 1  # the sequence of row r0
    b1 = int(np.searchsorted(cu_seqlens_q, r1 - 1, side="right"))  # one past that of row r1 - 1
    offsets = np.clip(cu_seqlens_q[b0 : b1 + 1].astype(np.int64), r0, r1) - r0
    return b0, b1, offsets.astype(np.int32)


def run_arrays(problem, run):
    """The seven arrays of ``run``: its rows of q, w and valid_lens, and of block_table its
    rows (per-token input) or its sequences' rows (grouped input)."""
    q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens = problem
    rows = slice(run.r0, run.r1)
    table = block_table[rows] if run.offsets is None else block_table[run.b0 : run.b1]
    return q[rows], w[rows], keys_fp4, key_scale, key_gscale, table, valid_lens[rows]


def check_shapes(problem, k, cu_seqlens_q):
    """``score_topk``'s checks of the whole (host) input's shapes and dtypes (not its values:
    ``check_runs``), before it is cut into runs."""
    q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens = problem
    if cu_seqlens_q is not None:  # (its (B, L) table is checked, io.load_grouped_problem): a stand-in
        # of the per-token table's shape, never read, so the shapes are checked whole first
        block_table = np.empty((int(q.shape[0]), int(block_table.shape[1])), dtype=np.int32)
    validate.check_score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, k, values=False)


def check_runs(problem, k, runs):
    """``score_topk``'s checks of the input's values a run at a time, each row named as the
    file numbers it (a grouped input's sequences too): refused before any row is scored. A
    grouped input's per-token table is built a run at a time for its run's checks."""
    for run in runs:
        args = run_arrays(problem, run)
        if run.offsets is not None:
            args = (*args[:5], ragged.expand_block_table(args[5], run.offsets, run.r1 - run.r0), args[6])
        validate.check_score_topk(*args, k, values=True, cu_seqlens=run.offsets, first_row=run.r0,
                                  first_seq=run.b0)


def score_runs(problem, k, runs, each_run=None, **kwargs):
    """score_topk over ``runs`` (already checked: ``check_runs``; the pool arrays shared),
    iterating ``each_run`` (``runs`` itself by default; a progress bar over it, say):
    ``(indices, scores)`` as NumPy arrays. A grouped input's runs go through
    ``score_topk_ragged`` on their sequences, so that the GPU shares each key tile between
    the rows of a sequence; ``kwargs`` go to every call."""
    parts = []
    pool = problem[2:5]
    if len(runs) > 1 and ops._pick_backend(kwargs.get("backend", "auto"), problem) == "cuda":  # gpu-only
        # the pool copied to the GPU once, where each run's call would copy its host arrays again
        pool = tuple(arrays.cupy().asarray(a) for a in pool)
    for run in runs if each_run is None else each_run:
        q, w, _, _, _, table, valid_lens = run_arrays(problem, run)
        if run.offsets is None:
            out = ops.score_topk(q, w, *pool, table, valid_lens, k, return_scores=True, **kwargs)
        else:
            out = ops.score_topk_ragged(q, w, *pool, table, run.offsets, valid_lens, k, return_scores=True,
                                        **kwargs)
        parts.append(tuple(arrays.to_numpy(x) for x in out))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
