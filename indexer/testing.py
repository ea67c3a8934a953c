"""Problem builders and the precision-contract checker shared by tests, CLI and benchmarks.

``check_topk`` is the README's "Precision" as code: an output is correct when no
unselected entry beats a selected one by more than both error bounds, the order is right
within the bounds, and exact ties (identical keys; plateaus of exact zeros) go to the
lower index.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from . import arrays, nvfp4, reference
from .validate import MAX_HEAD_DIM, MAX_HEADS, check_top_k

__all__ = ["Problem", "random_problem", "adversarial_problem", "ADVERSARIAL_KINDS", "quantize_blocks",
           "zero_plateau", "exact_scores", "check_topk", "TOL_EXACT", "TOL_FAST"]

#: per-entry error bound of the exact paths, as a fraction of the magnitude ``mag``
TOL_EXACT = 1e-6
#: per-entry error bound of the fast (tensor-core) path
TOL_FAST = 2.0**-11

# a dot this far below zero (relative to sum |q k|) is negative in every precision
_ZERO_MARGIN = 2.0**-7
# the GPU paths flush float32 subnormals (CuPy compiles with -ftz=true): a score within the
# least normal float of zero may come out as 0 (a tiny negative as -0, which ties +0), so two
# scores that close are not told apart by any check below
_FLUSH = 2.0**-126

ARRAY_NAMES = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens")


@dataclass
class Problem:
    """One score + top-k input, NumPy arrays named as in the contract."""

    q: np.ndarray
    w: np.ndarray
    keys_fp4: np.ndarray
    key_scale: np.ndarray
    key_gscale: np.ndarray
    block_table: np.ndarray
    valid_lens: np.ndarray
    top_k: int
    notes: dict = field(default_factory=dict)

    def arrays(self):
        """The seven arrays in ``score_topk``'s positional order."""
        return tuple(getattr(self, n) for n in ARRAY_NAMES)

    def args(self):
        """``score_topk``'s positional arguments: the seven arrays and top_k."""
        return self.arrays() + (self.top_k,)


def random_problem(rng, *, T=4, H=8, D=64, E=16, lens=None, top_k=32, L=None, P=None,
                   key_scale=1.0, gscale_spread=4.0, shared_blocks=False, dtype_q=np.float32):
    """A random problem with a shuffled pool and a block table per query.

    ``lens``: visible entries per query (an int for all, a sequence, or None for random
    lengths up to L*E). Pool blocks are quantized from Gaussian keys, each block with its
    own global scale (spread by ``gscale_spread``). With ``shared_blocks`` all queries see
    the same logical-to-physical map (as the tokens of one sequence do); otherwise each
    query gets its own random physical blocks, some of which other queries share.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng).__name__}")
    for name, v in (("T", T), ("H", H), ("D", D), ("E", E), ("L", L), ("P", P)):
        if v is None and name in "LP":
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
        if v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v}")
    # the scorer's own limits: a problem it would refuse is refused here, by its argument's name
    if D % 32 or D > MAX_HEAD_DIM:
        raise ValueError(f"D: expected a multiple of 32 up to {MAX_HEAD_DIM} (what score_topk takes), got {D}")
    if H > MAX_HEADS:
        raise ValueError(f"H: expected at most {MAX_HEADS} heads (what score_topk takes), got {H}")
    check_top_k(top_k)
    if not (isinstance(gscale_spread, numbers.Real) and 0 <= gscale_spread <= 100):
        raise ValueError(f"gscale_spread: expected a number in [0, 100] (powers of two), got {gscale_spread!r}")
    if lens is None:
        L = L or 4
        lens = rng.integers(0, L * E + 1, size=T)
    lens = arrays.as_array(np, lens, "lens")
    if lens.dtype.kind not in "iu" or lens.ndim > 1 or (lens.ndim == 1 and lens.shape[0] != T):
        raise ValueError(f"lens: expected an int or {T} ints, got {lens.dtype} {lens.shape}")
    if lens.size and not 0 <= int(lens.min()) <= int(lens.max()) < 2**31:
        raise ValueError("lens: expected lengths in [0, 2**31)")
    lens = np.broadcast_to(np.asarray(lens, dtype=np.int64), (T,)).copy()
    need_L = int(max(1, -(-int(lens.max(initial=0)) // E)))
    L = max(L or need_L, need_L)
    P = P or max(L * (1 if shared_blocks else 2), 1)
    keys = rng.standard_normal((P, E, D)).astype(np.float32) * np.float32(key_scale)
    keys *= np.exp2(rng.uniform(-gscale_spread, gscale_spread, size=(P, 1, 1))).astype(np.float32)
    codes, scales, gs = quantize_blocks(keys)
    if shared_blocks:
        row = rng.permutation(P)[:L].astype(np.int32)
        block_table = np.tile(row, (T, 1))
    else:
        block_table = np.stack([rng.choice(P, size=L, replace=L > P).astype(np.int32) for _ in range(T)])
    # ids past a row's visible blocks are never read: make them garbage on purpose
    for t in range(T):
        first_unused = -(-int(lens[t]) // E)
        block_table[t, first_unused:] = rng.integers(-5, 2**20, size=L - first_unused)
    q = rng.standard_normal((T, H, D)).astype(dtype_q)
    w = rng.standard_normal((T, H)).astype(np.float32)
    return Problem(q=q, w=w, keys_fp4=codes, key_scale=scales, key_gscale=gs,
                   block_table=np.ascontiguousarray(block_table, dtype=np.int32),
                   valid_lens=lens.astype(np.int32), top_k=int(top_k))


def quantize_blocks(keys):
    """NVFP4-encode float32 keys (P, E, D), one global scale per physical block."""
    keys = arrays.as_array(np, keys, "keys")
    if keys.ndim != 3 or keys.dtype.kind != "f" or 0 in keys.shape:
        raise ValueError(f"keys: expected float keys (P, E, D), none empty, got {keys.dtype} {keys.shape}")
    keys = keys.astype(np.float32, copy=False)
    amax = np.abs(keys).reshape(keys.shape[0], -1).max(axis=1)
    gs = nvfp4.global_scale_for(amax)
    codes, scales, _ = nvfp4.quantize(keys, gs[:, None])
    return codes, scales, np.ascontiguousarray(gs, dtype=np.float32)


def zero_plateau(p: Problem, rng) -> Problem:
    """p with every score exactly 0 (keys >= 0, queries < 0, weights > 0), in place: every
    entry ties, so the lowest indices win."""
    keys = np.abs(rng.standard_normal(p.keys_fp4.shape[:2] + (p.q.shape[2],))).astype(np.float32)
    p.keys_fp4, p.key_scale, p.key_gscale = quantize_blocks(keys)
    p.q = -np.abs(p.q) - np.float32(0.1)
    p.w = np.abs(p.w) + np.float32(0.1)
    return p


def exact_scores(p: Problem):
    """Per query: float64 scores (n,), magnitudes ``mag`` (n,), and a "certain zero" mask.

    ``mag[s] = sum_h |w[h]| * sum_d |q[h, d] * k[s, d]|`` is the rounding scale of the
    score. An entry is a certain zero when every head's dot is negative by more than the
    exact path's error bound, or when ``mag`` is 0 (an all-zero key, or zero weights, under
    finite inputs: every product is exactly 0), so every precision computes exactly 0 for it.
    """
    out = []
    for first, stop in reference._runs_of_equal_rows(p.block_table):
        # the rows of one block table (a sequence's tokens) decode their keys once
        keys = reference.row_keys(p.keys_fp4, p.key_scale, p.key_gscale, p.block_table[first],
                                  int(p.valid_lens[first:stop].max())).astype(np.float64)
        for t in range(first, stop):
            out.append(_exact_row(p, t, keys[: int(p.valid_lens[t])]))
    return out


def _exact_row(p: Problem, t, k):
    """``exact_scores`` of row t, whose decoded keys are ``k`` (n, D) float64."""
    q = p.q[t].astype(np.float64)
    w = p.w[t].astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        dots = q @ k.T
        absdots = np.abs(q) @ np.abs(k).T
        scores = w @ np.where(dots < 0, 0.0, dots)
        mag = np.abs(w) @ absdots
        certain_zero = (np.all(dots < -_ZERO_MARGIN * absdots - 1e-300, axis=0) | (mag == 0)) & np.isfinite(scores)
    return scores, mag, certain_zero


def _key_groups(p: Problem, t, n):
    """Entries of row t with identical stored keys (codes, scales and global scale), which
    score exactly equal in every precision: (group (n,) int64, rank (n,) int64), where
    ``group[s]`` numbers s's key (``reference.key_groups``) and ``rank[s]`` counts the
    entries of that key before s."""
    group = reference.key_groups(p.keys_fp4, p.key_scale, p.key_gscale, p.block_table[t], n)
    order = np.argsort(group, kind="stable")  # by key, then by index
    starts = np.searchsorted(group[order], group[order], side="left")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - starts
    return group, rank


def check_topk(p: Problem, indices, scores=None, *, tol=TOL_EXACT, exact=None, physical=False):
    """Assert that ``indices`` (T, top_k) (and ``scores``) meet the contract for problem ``p``.

    ``exact``: the output of ``exact_scores(p)``, to reuse across several checks.
    Raises AssertionError naming the row and the broken rule.
    """
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not 0 <= tol < math.inf:
        raise ValueError(f"tol: expected a finite number >= 0, got {tol!r}")  # NaN would pass anything
    if not isinstance(p, Problem):
        raise TypeError(f"p: expected an indexer.testing.Problem, got {type(p).__name__}")
    indices = np.asarray(indices)
    T, k = p.q.shape[0], p.top_k
    assert indices.shape == (T, k) and indices.dtype == np.int32, f"indices: shape {indices.shape} dtype {indices.dtype}"
    if scores is not None:
        scores = np.asarray(scores)
        assert scores.shape == (T, k) and scores.dtype == np.float32, f"scores: shape {scores.shape} dtype {scores.dtype}"
    if physical:
        logical = _physical_to_logical(p, indices)
    else:
        logical = indices
    exact = exact if exact is not None else exact_scores(p)
    for first, stop in reference._runs_of_equal_rows(p.block_table):
        # the rows of one block table (a sequence's tokens) number their keys once, for the
        # longest: a key's number and its entries' ranks do not depend on the row's length
        group, rank = _key_groups(p, first, int(p.valid_lens[first:stop].max()))
        for t in range(first, stop):
            n = int(p.valid_lens[t])
            _check_row(p, t, logical[t], None if scores is None else scores[t], tol, exact[t], (group[:n], rank[:n]))


def _physical_to_logical(p, indices):
    """Map physical slots back to logical entries. A row's table may list one physical block
    twice; each output position then takes the lowest logical entry of that slot not yet
    taken, which is the one the tie rule would pick."""
    E = p.keys_fp4.shape[1]
    out = indices.copy()  # a negative stays as it came: padding must be -1 in either numbering
    for t in range(indices.shape[0]):
        n = int(p.valid_lens[t])
        s = np.arange(n)
        phys = p.block_table[t][s // E].astype(np.int64) * E + s % E
        lookup = {}
        for logical, v in enumerate(phys):
            lookup.setdefault(int(v), []).append(logical)
        for j, v in enumerate(indices[t]):
            if v >= 0:
                assert lookup.get(int(v)), f"row {t}: physical index {v} is not visible to this query (or repeated too often)"
                out[t, j] = lookup[int(v)].pop(0)
    return out


def _check_row(p, t, idx, sc, tol, exact_row, groups):
    """The contract for row t: ``idx`` (top_k,) logical indices, ``sc`` its scores or None,
    ``exact_row`` the row's ``exact_scores``, ``groups`` its ``_key_groups`` (group, rank)."""
    score, mag, certain_zero = exact_row
    n, k = score.shape[0], idx.shape[0]
    selectable = ~np.isnan(score)
    m = min(k, int(selectable.sum()))
    chosen, pad = idx[:m], idx[m:]
    assert np.all(pad == -1), f"row {t}: expected {k - m} padding entries of -1 after {m} selections, got {idx.tolist()[:64]}"
    assert np.all((chosen >= 0) & (chosen < n)), f"row {t}: index out of [0, {n}): {chosen[(chosen < 0) | (chosen >= n)][:8]}"
    assert np.unique(chosen).size == m, f"row {t}: duplicate indices"
    assert np.all(selectable[chosen]), f"row {t}: selected an entry with a NaN score"
    if sc is not None:
        assert np.all(np.isneginf(sc[m:])), f"row {t}: padding scores must be -inf"
    if m == 0:
        return
    err = tol * mag + _FLUSH
    lo = score[chosen] - err[chosen]
    hi = score[chosen] + err[chosen]
    unsel = np.ones(n, dtype=bool)
    unsel[chosen] = False
    unsel &= selectable
    if unsel.any():
        best_left = np.max(score[unsel] - err[unsel])
        worst_in = np.min(hi)
        assert not best_left > worst_in, (
            f"row {t}: an unselected entry (score {best_left:.9g} - err) beats a selected one "
            f"({worst_in:.9g} + err)")
    # sorted within the bounds: no later entry clearly above an earlier one
    later_above = lo[1:] > np.minimum.accumulate(hi)[:-1]
    assert not later_above.any(), f"row {t}: output not sorted within the error bounds at position {int(np.argmax(later_above)) + 1}"
    # exact ties: identical keys, and plateaus of certain zeros, go to the lower index
    # (a key's entries share a score, NaN or not: a NaN key's are never chosen)
    group, rank = groups
    g_sel = group[chosen]
    taken = np.bincount(g_sel, minlength=int(group.max()) + 1)  # entries chosen of each key
    late = rank[chosen] >= taken[g_sel]  # chosen, though an entry of its key before it was not
    if late.any():
        s = int(chosen[np.argmax(late)])
        members = np.flatnonzero(group == group[s])
        sel = np.sort(chosen[g_sel == group[s]])
        raise AssertionError(f"row {t}: identical keys {members[:6].tolist()}: selected {sel[:6].tolist()}, "
                             f"expected the lowest indices")
    by_key = np.lexsort((rank[chosen], g_sel))  # the chosen, by key and then index
    out_of_order = (g_sel[by_key][1:] == g_sel[by_key][:-1]) & (by_key[1:] < by_key[:-1])
    assert not out_of_order.any(), f"row {t}: identical keys out of index order"
    pos = {int(s): j for j, s in enumerate(chosen)}
    zeros_sel = [s for s in chosen if certain_zero[s]]
    zeros_all = np.flatnonzero(certain_zero)
    assert zeros_sel == sorted(zeros_sel), f"row {t}: zero-score plateau not in index order"
    assert list(zeros_all[: len(zeros_sel)]) == zeros_sel, f"row {t}: zero-score plateau did not take the lowest indices"
    if sc is not None:
        got = sc[:m].astype(np.float64)
        bound = err[chosen] + np.abs(score[chosen]) * 2.0**-24 + 1e-37
        # a score past float32's range returns as +-inf (its sign the score's)
        past = np.isinf(got) & (np.sign(got) == np.sign(score[chosen])) & (np.abs(score[chosen]) + bound >= _F32_MAX)
        bad = ~(np.abs(got - score[chosen]) <= bound) & ~(np.isinf(got) & (got == score[chosen])) & ~past
        assert not bad.any(), f"row {t}: returned scores off by more than the bound at positions {np.flatnonzero(bad)[:8]}"
        if len(zeros_sel):
            zpos = [pos[s] for s in zeros_sel]
            assert np.all(sc[zpos] == 0), f"row {t}: certain-zero entries must score exactly 0"
        # highest first as returned, +0.0 for a zero, one score a stored key
        rising = sc[1:m] > sc[: m - 1]
        assert not rising.any(), f"row {t}: returned scores not highest first at position {int(np.argmax(rising)) + 1}"
        assert not np.any((sc[:m] == 0) & np.signbit(sc[:m])), f"row {t}: a zero score returned as -0.0 (expected +0.0)"
        same_key = g_sel[by_key][1:] == g_sel[by_key][:-1]  # identical keys score exactly equal
        assert np.array_equal(sc[by_key][1:][same_key], sc[by_key][:-1][same_key], equal_nan=True), (
            f"row {t}: identical keys returned different scores")


_F32_MAX = float(np.finfo(np.float32).max)

ADVERSARIAL_KINDS = ("ties", "zero_plateau", "short_rows", "nan", "off_edges", "extreme_scales", "shared_block")


def adversarial_problem(kind, rng, *, H=8, D=64, E=16, T=6, top_k=24):
    """A problem built to break selection or arithmetic; ``kind`` one of ``ADVERSARIAL_KINDS``.

    ties: whole physical blocks duplicated, one pair differing only in its zeros (-0 codes,
    codes under a zero scale) (identical keys must tie to the lower index);
    zero_plateau: almost every score exactly 0 (keys >= 0, queries < 0), a few positive;
    short_rows: lengths 0, 1 and below top_k; nan: NaN in q, in w, and NaN scale bytes;
    off_edges: lengths one off block edges; extreme_scales: global scales from 2**-60 to
    2**60 and queries scaled 1e-8..1e8; shared_block: every query sees one physical block.
    """
    if kind == "ties":
        p = random_problem(rng, T=T, H=H, D=D, E=E, lens=4 * E, top_k=top_k, L=4)
        P = p.keys_fp4.shape[0]
        for dst in range(1, P, 2):  # odd blocks copy even ones, scales included
            for a in (p.keys_fp4, p.key_scale, p.key_gscale):
                a[dst] = a[dst - 1]
        p.block_table[:, :4] = np.arange(4, dtype=np.int32)  # rows see blocks 0,1 (equal), 2,3 (equal)
        # blocks 2 and 3 are equal but for their zeros: block 3's +0 codes written as -0, and
        # a scale group of 0 in both over other codes in block 3 (the same decoded keys,
        # which tie as identical ones do: reference.key_groups)
        lo, hi = p.keys_fp4[3] & 0xF, p.keys_fp4[3] >> 4
        p.keys_fp4[3] = (np.where(lo == 0, 8, lo) | (np.where(hi == 0, 8, hi) << 4)).astype(np.uint8)
        p.key_scale[2:4, :, 1] = 0
        p.keys_fp4[3, :, 8:16] ^= 0x11
    elif kind == "zero_plateau":
        p = random_problem(rng, T=T, H=H, D=D, E=E, lens=3 * E + 5, top_k=max(top_k, 2 * E), L=4)
        keys = np.abs(rng.standard_normal(p.keys_fp4.shape[:2] + (D,))).astype(np.float32)
        pos = rng.random(keys.shape[:2]) < 0.1  # ~10% of entries can score above zero
        keys[pos] *= -1
        p.keys_fp4, p.key_scale, p.key_gscale = quantize_blocks(keys)
        p.q = -np.abs(p.q) - np.float32(0.1)
        p.w = np.abs(p.w) + np.float32(0.1)
    elif kind == "short_rows":
        lens = np.array([0, 1, top_k - 1, top_k, top_k + 1, 0][:T] + [3] * max(0, T - 6))
        p = random_problem(rng, T=T, H=H, D=D, E=E, lens=lens, top_k=top_k)
    elif kind == "nan":
        p = random_problem(rng, T=T, H=H, D=D, E=E, lens=3 * E, top_k=top_k, L=3)
        p.q[0, 0, 0] = np.nan            # row 0: every score NaN
        p.w[1, H - 1] = np.nan           # row 1: every score NaN
        b = p.block_table[2, 0]
        p.key_scale[b, : E // 2, 0] = 0x7F  # half of a block's keys NaN for every row that sees it
        p.key_scale[p.block_table[3, 1], 1, -1] = 0xFF
    elif kind == "off_edges":
        lens = np.array([E - 1, E, E + 1, 2 * E - 1, 2 * E + 1, 3 * E][:T])
        p = random_problem(rng, T=len(lens), H=H, D=D, E=E, lens=lens, top_k=top_k)
    elif kind == "extreme_scales":
        p = random_problem(rng, T=T, H=H, D=D, E=E, lens=4 * E, top_k=top_k, L=4)
        P = p.keys_fp4.shape[0]
        p.key_gscale[:] = np.exp2(rng.integers(-60, 61, size=P)).astype(np.float32)
        p.q *= np.float32(10.0) ** rng.integers(-8, 9, size=(T, 1, 1)).astype(np.float32)
    elif kind == "shared_block":
        p = random_problem(rng, T=T, H=H, D=D, E=E, lens=E, top_k=top_k, L=1, P=3)
        p.block_table[:, 0] = 1
    else:
        raise ValueError(f"kind: expected one of {ADVERSARIAL_KINDS}, got {kind!r}")
    p.notes["kind"] = kind
    return p
