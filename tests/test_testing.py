"""``indexer.testing.check_topk`` must reject every kind of broken output and accept correct
ones, including outputs that differ from the reference only within the error bounds."""

from __future__ import annotations

import numpy as np
import pytest

from indexer import reference, testing


def ref(p, **kw):
    return reference.score_topk(*p.args(), return_scores=True, **kw)


def row_info(p, t):
    """float64 scores and magnitudes of row t, from keys decoded by the (separately tested)
    reference decoder; the magnitude is the contract's sum_h |w| sum_d |q k|."""
    n = int(p.valid_lens[t])
    k = reference.row_keys(p.keys_fp4, p.key_scale, p.key_gscale, p.block_table[t], n).astype(np.float64)
    q, w = p.q[t].astype(np.float64), p.w[t].astype(np.float64)
    with np.errstate(invalid="ignore"):
        dots = q @ k.T
        scores = w @ np.where(dots < 0, 0.0, dots)
        mag = np.abs(w) @ (np.abs(q) @ np.abs(k).T)
    return scores, mag


def rejects(p, idx, sc=None, match=None, **kw):
    with pytest.raises(AssertionError, match=match):
        testing.check_topk(p, idx, sc, **kw)


@pytest.fixture
def prob(rng):
    return testing.random_problem(rng, T=3, H=4, D=32, E=16, lens=[60, 45, 70], top_k=16)


def slot(p, t, s):
    E = p.keys_fp4.shape[1]
    return int(p.block_table[t, s // E]), s % E


# ----------------------------------------------------------------------------------------
# correct outputs are accepted
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [
        dict(T=3, H=4, D=32, E=16, top_k=16),
        dict(T=2, H=8, D=64, E=8, lens=[3, 40], top_k=10),
        dict(T=2, H=2, D=128, E=64, lens=[0, 130], top_k=64, shared_blocks=True),
    ],
)
@pytest.mark.parametrize("physical", [False, True])
def test_accepts_reference(rng, kw, physical):
    p = testing.random_problem(rng, **kw)
    idx, sc = ref(p, physical=physical)
    testing.check_topk(p, idx, sc, physical=physical)
    testing.check_topk(p, idx, physical=physical)
    ex = testing.exact_scores(p)
    testing.check_topk(p, idx, sc, physical=physical, exact=ex, tol=testing.TOL_FAST)


def test_accepts_scores_within_tolerance(prob):
    idx, sc = ref(prob)
    pert = sc.astype(np.float64).copy()
    rng = np.random.default_rng(5)
    for t in range(3):
        scores, mag = row_info(prob, t)
        # exact zeros (all dots negative) must stay exactly 0: perturb the others only
        m = (idx[t] >= 0) & (scores[np.maximum(idx[t], 0)] != 0)
        assert m.sum() >= 8
        pert[t, m] += rng.uniform(-0.5, 0.5, m.sum()) * testing.TOL_EXACT * mag[idx[t, m]]
    testing.check_topk(prob, idx, pert.astype(np.float32))
    # 1.5 times the tolerance on one entry (plus float32 rounding slack): rejected
    bad = sc.astype(np.float64).copy()
    _, mag = row_info(prob, 1)
    bad[1, 3] += 1.5 * testing.TOL_EXACT * mag[idx[1, 3]] + 4 * abs(bad[1, 3]) * 2.0**-24
    rejects(prob, idx, bad.astype(np.float32), match=r"row 1: returned scores off")


def _closest_adjacent_pair(p, idx, t):
    scores, mag = row_info(p, t)
    chosen = idx[t][idx[t] >= 0]
    gaps = [(scores[a] - scores[b]) / (mag[a] + mag[b]) for a, b in zip(chosen, chosen[1:])]
    j = int(np.argmin(gaps))
    assert gaps[j] > 0
    return j, gaps[j]


def test_swap_within_tolerance_accepted_outside_rejected(prob):
    """Two adjacent outputs swapped: fine exactly when their gap is below the summed bounds."""
    idx, _ = ref(prob)
    t = 2
    j, rel_gap = _closest_adjacent_pair(prob, idx, t)
    swapped = idx.copy()
    swapped[t, [j, j + 1]] = swapped[t, [j + 1, j]]
    testing.check_topk(prob, swapped, tol=rel_gap * 1.001)
    rejects(prob, swapped, tol=rel_gap * 0.999, match=rf"row {t}: output not sorted within the error bounds at position {j + 1}")


def test_boundary_swap_within_tolerance_accepted_outside_rejected(prob):
    """The last selected entry traded for the best unselected one: same rule at the top-k edge."""
    idx, _ = ref(prob)
    t, k = 0, prob.top_k
    scores, mag = row_info(prob, t)
    unsel = np.setdiff1d(np.arange(int(prob.valid_lens[t])), idx[t])
    u = int(unsel[np.argmax(scores[unsel])])
    last = int(idx[t, k - 1])
    rel_gap = (scores[last] - scores[u]) / (mag[last] + mag[u])
    assert rel_gap > 0
    traded = idx.copy()
    traded[t, k - 1] = u
    testing.check_topk(prob, traded, tol=rel_gap * 1.001)
    rejects(prob, traded, tol=rel_gap * 0.999, match=rf"row {t}: an unselected entry .* beats a selected one")


# ----------------------------------------------------------------------------------------
# broken outputs are rejected
# ----------------------------------------------------------------------------------------
def test_rejects_swapped_order(prob):
    idx, sc = ref(prob)
    bad = idx.copy()
    bad[1, [0, 1]] = bad[1, [1, 0]]
    rejects(prob, bad, match=r"row 1: output not sorted")


def test_rejects_reversed_row(prob):
    idx, _ = ref(prob)
    bad = idx.copy()
    bad[0] = bad[0, ::-1]
    rejects(prob, bad, match=r"row 0: output not sorted")


def test_rejects_dropped_best(prob):
    """The best entry dropped, the rest moved up and the next-best unselected appended:
    order is fine, but the best entry is missing."""
    idx, _ = ref(prob)
    wide = reference.score_topk(*prob.arrays(), prob.top_k + 1)
    bad = idx.copy()
    bad[2] = wide[2, 1:]
    rejects(prob, bad, match=r"row 2: an unselected entry .* beats a selected one")


def test_rejects_worse_entry_in_the_middle(prob):
    idx, _ = ref(prob)
    scores, _ = row_info(prob, 0)
    worst = int(np.nanargmin(scores))
    bad = idx.copy()
    bad[0, 5] = worst
    rejects(prob, bad, match=r"row 0: an unselected entry .* beats a selected one")


def test_rejects_duplicate_index(prob):
    idx, _ = ref(prob)
    bad = idx.copy()
    bad[1, -1] = bad[1, 0]
    rejects(prob, bad, match=r"row 1: duplicate indices")


@pytest.mark.parametrize("value", ["n", "-2", "L*E", "big"])
def test_rejects_out_of_range_index(prob, value):
    idx, _ = ref(prob)
    n = int(prob.valid_lens[1])
    v = {"n": n, "-2": -2, "L*E": prob.block_table.shape[1] * 16, "big": 2**31 - 1}[value]
    bad = idx.copy()
    bad[1, -1] = v
    rejects(prob, bad, match=r"row 1: index out of \[0, 45\)")


def test_rejects_nan_score_entry(rng):
    p = testing.random_problem(rng, T=2, H=4, D=32, E=16, lens=[40, 40], top_k=10, shared_blocks=True)
    idx, _ = ref(p)
    s_nan = int(idx[0, 0])  # poison the best entry of row 0 (row 1 sees the same blocks)
    b, e = slot(p, 0, s_nan)
    p.key_scale[b, e, 1] = 0x7F
    idx2, sc2 = ref(p)
    testing.check_topk(p, idx2, sc2)
    assert s_nan not in idx2[0]
    bad = idx2.copy()
    bad[0, -1] = s_nan
    rejects(p, bad, match=r"row 0: selected an entry with a NaN score")
    # the old output (still containing the NaN entry at the top) is rejected too
    rejects(p, idx, match=r"row 0: selected an entry with a NaN score")


def test_rejects_selection_from_nan_row(rng):
    p = testing.random_problem(rng, T=2, H=4, D=32, E=16, lens=[40, 40], top_k=10)
    p.w[1, 2] = np.nan
    idx, sc = ref(p)
    assert np.all(idx[1] == -1)
    testing.check_topk(p, idx, sc)
    bad = idx.copy()
    bad[1, 0] = 3
    rejects(p, bad, match=r"row 1: expected 10 padding entries of -1 after 0 selections")


class TestPadding:
    @pytest.fixture
    def short(self, rng):
        p = testing.random_problem(rng, T=3, H=4, D=32, E=16, lens=[7, 0, 30], top_k=12)
        return p, *ref(p)

    def test_reference_pads(self, short):
        p, idx, sc = short
        assert np.all(idx[0, 7:] == -1) and np.all(idx[1] == -1)
        testing.check_topk(p, idx, sc)

    def test_rejects_nonneg_padding(self, short):
        p, idx, _ = short
        bad = idx.copy()
        bad[0, 9] = 0
        rejects(p, bad, match=r"row 0: expected 5 padding entries of -1 after 7 selections")

    def test_rejects_missing_selection(self, short):
        p, idx, _ = short
        bad = idx.copy()
        bad[0, 6] = -1  # one selectable entry left out: the row is padded too early
        rejects(p, bad, match=r"row 0: index out of \[0, 7\)")

    def test_rejects_selection_in_empty_row(self, short):
        p, idx, _ = short
        bad = idx.copy()
        bad[1, 0] = 0
        rejects(p, bad, match=r"row 1: expected 12 padding entries")

    def test_rejects_padding_scores(self, short):
        p, idx, sc = short
        bad = sc.copy()
        bad[0, 8] = 0.0
        rejects(p, idx, bad, match=r"row 0: padding scores must be -inf")

    def test_rejects_padding_scores_of_empty_row(self, short):
        p, idx, sc = short
        bad = sc.copy()
        bad[1, :] = 0.0  # the empty row's scores must all be -inf
        rejects(p, idx, bad, match=r"row 1: padding scores must be -inf")


def copy_key(p, t, src, targets):
    """Row t's entries ``targets`` given entry ``src``'s stored key (codes and block scales)."""
    b0, e0 = slot(p, t, src)
    for s in targets:
        b, e = slot(p, t, int(s))
        p.keys_fp4[b, e] = p.keys_fp4[b0, e0]
        p.key_scale[b, e] = p.key_scale[b0, e0]


def _with_copies(rng, n_copies):
    """A problem whose row 0 has a group of identical keys straddling the top-k boundary."""
    p = testing.random_problem(rng, T=1, H=4, D=32, E=16, lens=[64], top_k=12)
    p.key_gscale[:] = p.key_gscale[0]  # one global scale: equal bytes are equal keys
    idx, _ = ref(p)
    src = int(idx[0, p.top_k - 2])  # second-to-last selected: copies compete for the last places
    unsel = np.setdiff1d(np.arange(64), idx[0])
    targets = rng.choice(unsel, size=n_copies, replace=False)
    copy_key(p, 0, src, targets)
    group = sorted([src] + [int(s) for s in targets])
    return p, group


def test_identical_keys_reference_takes_lowest(rng):
    p, group = _with_copies(rng, 4)
    idx, sc = ref(p)
    testing.check_topk(p, idx, sc)
    sel = [s for s in idx[0].tolist() if s in group]
    assert len(sel) == 2 and sel == group[:2]  # the boundary cut the group of 5


def test_rejects_tie_to_higher_index(rng):
    p, group = _with_copies(rng, 4)
    idx, _ = ref(p)
    bad = idx.copy()
    j = int(np.flatnonzero(bad[0] == group[1])[0])
    bad[0, j] = group[4]  # a higher copy instead of the lower one: same score, wrong tie rule
    rejects(p, bad, match=r"row 0: identical keys .* expected the lowest indices")


def test_rows_of_one_sequence_keep_the_tie_rule_each_at_its_own_length(rng):
    """Rows sharing a block table number their keys once, for the longest (check_topk): a
    shorter row must still be held to the lowest of its own visible copies, and copies past
    its length must not count."""
    p = testing.random_problem(rng, T=3, H=4, D=32, E=16, lens=[64, 40, 64], top_k=12, shared_blocks=True)
    p.block_table[:] = p.block_table[0]  # one table (random_problem fills ids past a row's end)
    p.key_gscale[:] = p.key_gscale[0]  # one global scale: equal bytes are equal keys
    idx, _ = ref(p)
    src = int(idx[1, p.top_k - 2])  # row 1 (40 entries): copies compete for its last places
    unsel = np.setdiff1d(np.arange(40), idx[1])
    targets = [int(s) for s in rng.choice(unsel, size=3, replace=False)] + [45, 60]  # two past row 1's end
    copy_key(p, 1, src, targets)
    idx, sc = ref(p)
    testing.check_topk(p, idx, sc)
    visible = sorted([src] + targets[:3])
    assert [s for s in idx[1].tolist() if s in visible] == visible[:2]  # the two lowest visible copies
    bad = idx.copy()
    bad[1, int(np.flatnonzero(bad[1] == visible[1])[0])] = visible[3]  # a higher visible copy
    rejects(p, bad, match=r"row 1: identical keys .* expected the lowest indices")


@pytest.mark.parametrize("tol", [float("nan"), -1.0, float("inf"), "1e-6", True])
def test_a_tolerance_that_would_pass_anything_is_refused(rng, tol):
    p = testing.random_problem(rng, T=1, H=4, D=32, E=16, lens=[64], top_k=12)
    idx, sc = ref(p)
    with pytest.raises(ValueError, match="^tol: expected a finite number >= 0"):
        testing.check_topk(p, idx, sc, tol=tol)


def test_rejects_the_higher_copy_taking_the_last_place(rng):
    """One place for a group of identical keys (copies of the k-th entry): the lowest copy
    takes it; the highest copy there instead is the tie rule's most common off-by-one."""
    p = testing.random_problem(rng, T=1, H=4, D=32, E=16, lens=[64], top_k=12)
    p.key_gscale[:] = p.key_gscale[0]  # one global scale: equal bytes are equal keys
    idx, _ = ref(p)
    src = int(idx[0, p.top_k - 1])
    copy_key(p, 0, src, rng.choice(np.setdiff1d(np.arange(64), idx[0]), size=3, replace=False))
    idx, sc = ref(p)
    testing.check_topk(p, idx, sc)
    group = np.flatnonzero(testing._key_groups(p, 0, 64)[0] == testing._key_groups(p, 0, 64)[0][src])
    assert group.size == 4 and idx[0, -1] == group[0]  # one place, the lowest copy
    bad = idx.copy()
    bad[0, -1] = group[-1]
    rejects(p, bad, match=r"row 0: identical keys .* expected the lowest indices")


def test_rejects_a_dropped_best_in_a_row_with_a_nan_key(rng):
    """An unselectable (NaN) entry in the row must not blind the check of the others."""
    p = testing.random_problem(rng, T=1, H=4, D=32, E=16, lens=[64], top_k=12)
    idx, _ = ref(p)
    nan_entry = int(np.setdiff1d(np.arange(64), idx[0])[0])
    b, e = slot(p, 0, nan_entry)
    p.key_scale[b, e, 0] = 0x7F  # E4M3 NaN: the entry's score is NaN
    idx, sc = ref(p)
    testing.check_topk(p, idx, sc)
    worst = testing.exact_scores(p)[0][0].copy()
    worst[idx[0]] = np.inf
    worst[np.isnan(worst)] = np.inf
    bad = idx.copy()
    bad[0, 0] = int(np.argmin(worst))  # the best entry dropped for the row's worst selectable one
    bad[0] = np.concatenate([bad[0, 1:], bad[0, :1]])  # kept in score order
    rejects(p, bad, match=r"row 0: an unselected entry")


def test_rejects_tied_copies_out_of_index_order(rng):
    p, group = _with_copies(rng, 4)
    idx, _ = ref(p)
    bad = idx.copy()
    a, b = (int(np.flatnonzero(bad[0] == s)[0]) for s in group[:2])
    bad[0, [a, b]] = bad[0, [b, a]]
    rejects(p, bad, match=r"row 0: identical keys out of index order")


@pytest.mark.parametrize("mult", [None, 0])  # 0: every key hashes alike, so the bytes group them
def test_key_groups_exact_even_when_hashes_collide(rng, monkeypatch, mult):
    if mult is not None:
        monkeypatch.setattr(reference, "_KEY_HASH_MULT", np.uint64(mult))
    p, group = _with_copies(rng, 4)
    g, rank = testing._key_groups(p, 0, 64)
    assert np.unique(g).size == 64 - 4  # the five copies are one key, every other entry its own
    assert len(set(g[group].tolist())) == 1 and rank[group].tolist() == [0, 1, 2, 3, 4]
    others = np.setdiff1d(np.arange(64), group)
    assert not np.isin(g[others], g[group]).any() and np.all(rank[others] == 0)
    idx, _ = ref(p)
    bad = idx.copy()
    bad[0, int(np.flatnonzero(bad[0] == group[1])[0])] = group[4]
    rejects(p, bad, match=r"row 0: identical keys .* expected the lowest indices")


@pytest.fixture
def plateau(rng):
    """Positive keys, negative queries, positive weights: every score is exactly 0 except for
    a few entries with negated keys."""
    p = testing.random_problem(rng, T=2, H=4, D=32, E=16, lens=[50, 64], top_k=10)
    p.keys_fp4 &= np.uint8(0x77)
    p.q[:] = -np.abs(p.q) - np.float32(0.05)
    p.w[:] = np.abs(p.w) + np.float32(0.1)
    for s in (7, 33, 40):
        b, e = slot(p, 0, s)
        p.keys_fp4[b, e] |= np.uint8(0x88)
    idx, sc = ref(p)
    scores, _ = row_info(p, 0)
    assert np.sum(scores > 0) >= 3 and np.sum(scores == 0) > 30
    return p, idx, sc


def test_plateau_reference_accepted(plateau):
    p, idx, sc = plateau
    testing.check_topk(p, idx, sc)
    scores, _ = row_info(p, 0)
    npos = int(np.sum(scores > 0))
    zeros = np.flatnonzero(scores == 0)
    assert idx[0, npos:].tolist() == zeros[: p.top_k - npos].tolist()


def test_rejects_plateau_taking_higher_indices(plateau):
    p, idx, _ = plateau
    scores, _ = row_info(p, 0)
    zeros = np.flatnonzero(scores == 0)
    unselected_zero = int(np.setdiff1d(zeros, idx[0])[-1])
    bad = idx.copy()
    bad[0, -1] = unselected_zero
    rejects(p, bad, match=r"row 0: zero-score plateau did not take the lowest indices")


def test_rejects_plateau_out_of_order(plateau):
    p, idx, _ = plateau
    bad = idx.copy()
    bad[0, [-1, -2]] = bad[0, [-2, -1]]
    rejects(p, bad, match=r"row 0: zero-score plateau not in index order")


def test_rejects_nonzero_plateau_score(plateau):
    p, idx, sc = plateau
    bad = sc.copy()
    bad[0, -1] = np.float32(1e-30)  # within the numeric bound, but a certain zero must be 0
    rejects(p, idx, bad, match=r"row 0: certain-zero entries must score exactly 0")


@pytest.mark.parametrize("how", ["relative", "sign", "nan", "inf", "shifted"])
def test_rejects_wrong_scores(prob, how):
    idx, sc = ref(prob)
    bad = sc.copy()
    if how == "relative":
        bad[2, 4] *= np.float32(1 + 1e-3)
    elif how == "sign":
        bad[2, 4] = -bad[2, 4]
    elif how == "nan":
        bad[2, 4] = np.nan
    elif how == "inf":
        bad[2, 4] = np.inf
    else:
        bad[2] = np.roll(bad[2], 1)
    rejects(prob, idx, bad, match=r"row 2: returned scores off by more than the bound")


# ----------------------------------------------------------------------------------------
# physical indices and the output's own shape
# ----------------------------------------------------------------------------------------
def test_rejects_physical_not_visible(rng):
    p = testing.random_problem(rng, T=2, H=2, D=32, E=8, lens=[20, 30], top_k=6)
    idx, _ = ref(p, physical=True)
    testing.check_topk(p, idx, physical=True)
    bad = idx.copy()
    bad[0, 2] = int(p.block_table[0, 2]) * 8 + 7  # slot 23 of row 0: beyond its 20 entries
    rejects(p, bad, physical=True, match=r"row 0: physical index \d+ is not visible")
    logical = reference.score_topk(*p.args())
    rejects(p, logical, physical=True, match=r"row 0: ")  # logical indices passed as physical


def test_physical_with_repeated_block_accepted(rng):
    p = testing.random_problem(rng, T=2, H=2, D=32, E=8, lens=20, top_k=8, L=3, P=2)
    assert any(len(set(row[:3].tolist())) < 3 for row in p.block_table)  # a repeated block
    idx, sc = ref(p, physical=True)
    testing.check_topk(p, idx, sc, physical=True)


@pytest.mark.parametrize("how", ["int64", "short", "transposed"])
def test_rejects_wrong_output_array(prob, how):
    idx, _ = ref(prob)
    bad = {"int64": idx.astype(np.int64), "short": idx[:, :-1], "transposed": idx.T}[how]
    rejects(prob, bad, match=r"^indices: shape")


@pytest.mark.parametrize("kind", testing.ADVERSARIAL_KINDS)
@pytest.mark.parametrize("physical", [False, True])
def test_accepts_reference_on_adversarial_problems(rng, kind, physical):
    p = testing.adversarial_problem(kind, rng, H=4, D=32, E=16, T=6, top_k=24)
    idx, sc = ref(p, physical=physical)
    testing.check_topk(p, idx, sc, physical=physical)


@pytest.mark.parametrize("how", ["float64", "extra_column", "short"])
def test_rejects_wrong_scores_array(prob, how):
    idx, sc = ref(prob)
    bad = {"float64": sc.astype(np.float64),
           "extra_column": np.concatenate([sc, np.full((3, 1), -np.inf, np.float32)], axis=1),
           "short": sc[:, :-1]}[how]
    rejects(prob, idx, bad, match=r"scores")


# ----------------------------------------------------------------------------------------
# scores the GPU paths flush: within the least normal float of zero, they tie with +0


def test_flushed_tiny_negatives_tie_with_zero():
    # block 0: scores ~-1e-39 (global scale 2^-126, tiny weights), which -ftz stores as -0;
    # block 1: certain zeros. The reference takes the zeros first; a GPU answer that ties the
    # flushed -0 with +0 takes the lowest indices: both meet the contract. An entry of a
    # clearly negative score over a zero does not.
    rng = np.random.default_rng(11)
    E, D, H = 16, 64, 8
    keys = np.abs(rng.standard_normal((3, E, D))).astype(np.float32)
    keys[0] *= -1  # dots > 0 against the negative queries: negative scores
    keys[2] *= -1
    codes, scales, gs = testing.quantize_blocks(keys)
    gs = gs.copy()
    gs[0] = np.float32(2.0**-126)
    q = (-np.abs(rng.standard_normal((1, H, D))) - 0.1).astype(np.float32)
    w = (-1e-8 * (1 + np.abs(rng.standard_normal((1, H))))).astype(np.float32)
    p = testing.Problem(q, w, codes, scales, gs, np.array([[0, 1, 2]], np.int32), np.array([3 * E]), 20)
    score = testing.exact_scores(p)[0][0]
    assert np.all((score[:E] < 0) & (score[:E] > -(2.0**-126))) and np.all(score[E:2 * E] == 0)
    assert np.all(score[2 * E:] < -1e-30)
    want, want_sc = reference.score_topk(*p.arrays(), p.top_k, return_scores=True)
    testing.check_topk(p, want, want_sc.astype(np.float32))
    flushed = np.arange(20, dtype=np.int32)[None]  # -0 ties +0: the 20 lowest indices
    testing.check_topk(p, flushed, np.zeros((1, 20), np.float32), tol=testing.TOL_FAST)
    bad = want.copy()
    bad[0, -1] = 2 * E  # a normal negative over a zero
    with pytest.raises(AssertionError, match="beats a selected one"):
        testing.check_topk(p, bad, tol=testing.TOL_FAST)


# ----------------------------------------------------------------------------------------
# what a review of the oracle found it let through (each a wrong output it accepted before)
# ----------------------------------------------------------------------------------------
def test_rejects_physical_padding_other_than_minus_one(rng):
    """Physical indices: padding is -1 as in the logical numbering (-2 or INT_MIN passed)."""
    p = testing.random_problem(rng, T=2, H=4, D=32, E=8, lens=[5, 30], top_k=8)
    idx, sc = ref(p, physical=True)
    for junk in (-2, np.iinfo(np.int32).min):
        bad = idx.copy()
        bad[0, 5:] = junk
        rejects(p, bad, sc, physical=True, match="row 0: expected 3 padding entries of -1")


def test_rejects_a_zero_score_returned_as_minus_zero(plateau):
    p, idx, sc = plateau
    bad = sc.copy()
    bad[bad == 0] = -0.0
    assert ((bad == 0) & np.signbit(bad)).any()
    rejects(p, idx, bad, match=r"a zero score returned as -0.0")


def test_rejects_returned_scores_rising_within_their_bounds(rng):
    """Each score within its own bound, but the second above the first: not highest first."""
    tol = testing.TOL_FAST
    for _ in range(200):
        p = testing.random_problem(rng, T=1, H=4, D=32, E=16, lens=[64], top_k=16)
        idx, sc = ref(p)
        score, mag = row_info(p, 0)
        err = tol * mag
        near = [j for j in range(15) if score[idx[0, j]] - score[idx[0, j + 1]] < 0.5 * (err[idx[0, j]] + err[idx[0, j + 1]])]
        if near:
            break
    j = near[0]
    a, b = idx[0, j], idx[0, j + 1]
    bad = sc.copy()
    bad[0, j], bad[0, j + 1] = score[a] - 0.9 * err[a], score[b] + 0.9 * err[b]
    assert bad[0, j + 1] > bad[0, j]
    rejects(p, idx, bad, tol=tol, match=f"row 0: returned scores not highest first at position {j + 1}")


def test_rejects_identical_keys_returning_different_scores(rng):
    p, dups = _with_copies(rng, 3)
    idx, sc = ref(p)
    row = idx[0].tolist()
    pos = sorted(row.index(s) for s in dups if s in row)
    assert len(pos) >= 2 and pos[-1] == pos[-2] + 1  # equal scores: side by side
    bad = sc.copy()
    last = pos[-1]  # the last copy one ulp lower (within every bound), still not above the next
    bad[0, last] = np.nextafter(bad[0, last], np.float32(-np.inf))
    assert last + 1 == p.top_k or bad[0, last] >= bad[0, last + 1]
    testing.check_topk(p, idx, sc)
    rejects(p, idx, bad, match="row 0: identical keys returned different scores")


def _twin_blocks(variant):
    """Block 1 a copy of block 0 but for its bytes' zeros: every +0 code written as -0, or a
    scale group of 0 (in both blocks) over other codes: the same decoded keys, which tie."""
    E = 16
    p = testing.random_problem(np.random.default_rng(5), T=1, H=4, D=32, E=E, lens=[2 * E], top_k=5, L=2, P=2,
                               gscale_spread=0)
    p.block_table[0] = [0, 1]
    for a in (p.keys_fp4, p.key_scale, p.key_gscale):
        a[1] = a[0]
    if variant == "minus zero codes":
        lo, hi = p.keys_fp4[1] & 0xF, p.keys_fp4[1] >> 4
        p.keys_fp4[1] = (np.where(lo == 0, 8, lo) | (np.where(hi == 0, 8, hi) << 4)).astype(np.uint8)
    else:
        p.key_scale[:, :, 1] = 0
        p.keys_fp4[1, :, 8:16] ^= 0x11
    assert not np.array_equal(p.keys_fp4[0], p.keys_fp4[1])
    keys = reference.row_keys(p.keys_fp4, p.key_scale, p.key_gscale, p.block_table[0], 2 * E)
    assert np.array_equal(keys[:E], keys[E:])
    return p, E


@pytest.mark.parametrize("variant", ["minus zero codes", "codes under a zero scale"])
def test_keys_equal_but_for_their_zeros_tie_to_the_lower_index(variant):
    p, E = _twin_blocks(variant)
    idx, sc = ref(p)
    testing.check_topk(p, idx, sc)
    chosen = idx[0].tolist()
    j = next(j for j, s in enumerate(chosen) if s < E and s + E not in chosen)  # a twin left out
    bad = idx.copy()
    bad[0, j] += E  # the higher twin in the lower's place
    rejects(p, bad, sc, match="row 0: identical keys")
    rejects(p, bad, match="row 0: identical keys")


def test_accepts_a_score_past_float32_returned_as_inf(rng):
    """A finite float64 score past float32's range returns as +inf (the reference's answer
    was refused before)."""
    p = testing.random_problem(np.random.default_rng(2), T=1, H=2, D=32, E=16, lens=[16], top_k=4, gscale_spread=0)
    p.q = (np.sign(p.q) * np.float32(1e38)).astype(np.float32)
    p.w[:] = 1
    idx, sc = ref(p)
    assert np.isposinf(sc[0]).any() and np.isfinite(row_info(p, 0)[0]).all()
    testing.check_topk(p, idx, sc)
    bad = sc.copy()
    bad[0, 0] = -np.inf  # the wrong sign is still refused
    rejects(p, idx, bad)


@pytest.mark.parametrize("kw, error, match", [
    (dict(D=16), ValueError, "^D: expected a multiple of 32 up to 256"),
    (dict(D=48), ValueError, "^D: expected a multiple of 32"),
    (dict(D=288), ValueError, "^D: expected a multiple of 32 up to 256"),
    (dict(H=129), ValueError, "^H: expected at most 128 heads"),
    (dict(top_k=0), ValueError, "^top_k: expected 1 <= top_k <= 4096"),
    (dict(top_k=4097), ValueError, "^top_k: expected 1 <= top_k <= 4096"),
    (dict(top_k=2.0), TypeError, "^top_k: expected an int"),
])
def test_random_problem_refuses_what_the_scorer_would_refuse(kw, error, match):
    """A problem the scorer cannot take is refused as it is built, by its argument's name (it
    was built, then refused by score_topk naming q or top_k)."""
    with pytest.raises(error, match=match):
        testing.random_problem(np.random.default_rng(0), **kw)
