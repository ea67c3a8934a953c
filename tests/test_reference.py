"""The NumPy reference against a brute-force, entry-by-entry evaluation of the contract.

The brute force below shares no code with ``indexer``: it decodes every key element from
its own E2M1/E4M3 tables, computes each dot product with Python floats (float64), and
sorts with ``sorted`` on (-score, s), skipping NaN.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import indexer
from indexer import ops, reference, testing

# ----------------------------------------------------------------------------------------
# the brute force
# ----------------------------------------------------------------------------------------
_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _e4m3(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    if exp == 0:
        return sign * man * 2.0**-9
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


_E4M3 = [_e4m3(b) for b in range(256)]


def decode_key(codes_row, scale_row, gscale) -> list[float]:
    """One key, element by element: float32((e2m1 * e4m3) * g). The first product is exact;
    the float64 product with g has at most 30 significant bits, so one rounding to float32."""
    g = float(gscale)
    out = []
    for d in range(2 * len(codes_row)):
        byte = int(codes_row[d // 2])
        code = byte & 0xF if d % 2 == 0 else byte >> 4
        v = (_E2M1[code] * _E4M3[int(scale_row[d // 16])]) * g
        out.append(float(np.float32(v)))
    return out


def brute_scores(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens):
    """float64 scores per row, a list of lists, NaN kept."""
    T, H, _ = q.shape
    E = keys_fp4.shape[1]
    cache = {}
    rows = []
    for t in range(T):
        qt = q[t].astype(np.float64).tolist()
        wt = w[t].astype(np.float64).tolist()
        row = []
        for s in range(int(valid_lens[t])):
            b, e = int(block_table[t, s // E]), s % E
            if (b, e) not in cache:
                cache[b, e] = decode_key(keys_fp4[b, e], key_scale[b, e], key_gscale[b])
            k = cache[b, e]
            score = 0.0
            for h in range(H):
                dot = 0.0
                for qd, kd in zip(qt[h], k):
                    dot += qd * kd
                relu = 0.0 if dot < 0 else dot  # NaN stays NaN
                score += wt[h] * relu
            row.append(score)
        rows.append(row)
    return rows


def brute_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k, physical=False):
    rows = brute_scores(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens)
    E = keys_fp4.shape[1]
    T = len(rows)
    idx = np.full((T, top_k), -1, dtype=np.int64)
    sc = np.full((T, top_k), -np.inf, dtype=np.float64)
    for t, row in enumerate(rows):
        order = sorted((-v, s) for s, v in enumerate(row) if not math.isnan(v))[:top_k]
        for j, (neg, s) in enumerate(order):
            idx[t, j] = int(block_table[t, s // E]) * E + s % E if physical else s
            sc[t, j] = -neg
    return idx, sc, rows


# ----------------------------------------------------------------------------------------
# problem builders (independent of indexer.testing)
# ----------------------------------------------------------------------------------------
def make_problem(rng, *, T, H, D, E, lens, top_k, L=None, P=None, scale_lo=0x28, scale_hi=0x48):
    """Random NVFP4 bytes in a shuffled pool; block ids past the visible blocks are garbage."""
    lens = np.broadcast_to(np.asarray(lens, dtype=np.int64), (T,)).copy()
    need = max(1, -(-int(lens.max()) // E))
    L = max(L or need, need)
    P = P or L + 3
    keys_fp4 = rng.integers(0, 256, size=(P, E, D // 2), dtype=np.uint8)
    key_scale = rng.integers(scale_lo, scale_hi, size=(P, E, D // 16), dtype=np.uint8)
    key_gscale = np.exp2(rng.uniform(-3, 3, size=P)).astype(np.float32)
    bt = np.stack([rng.permutation(P)[:L] for _ in range(T)]).astype(np.int32)
    for t in range(T):
        used = -(-int(lens[t]) // E)
        bt[t, used:] = rng.choice(np.array([-1, -7, P, 2**30], np.int32), size=L - used)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    w = rng.standard_normal((T, H)).astype(np.float32)
    return dict(q=q, w=w, keys_fp4=keys_fp4, key_scale=key_scale, key_gscale=key_gscale,
                block_table=bt, valid_lens=lens.astype(np.int32), top_k=int(top_k))


ORDER = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens", "top_k")


def args_of(p):
    return tuple(p[k] for k in ORDER)


def slot_of(p, t, s):
    E = p["keys_fp4"].shape[1]
    return int(p["block_table"][t, s // E]), s % E


def assert_matches_brute(p, *, physical=False):
    idx, sc = reference.score_topk(*args_of(p), return_scores=True, physical=physical)
    b_idx, b_sc, rows = brute_topk(*args_of(p), physical=physical)
    assert idx.dtype == np.int32 and idx.shape == (p["q"].shape[0], p["top_k"])
    assert sc.dtype == np.float32 and sc.shape == idx.shape
    np.testing.assert_array_equal(idx, b_idx)
    pad = b_idx < 0
    assert np.all(np.isneginf(sc[pad]))
    # float64 sums in another order, then one rounding to float32
    got, want = sc[~pad].astype(np.float64), b_sc[~pad]
    assert np.all(np.abs(got - want) <= 2.0**-23 * np.abs(want) + 1e-30)
    # indices alone (the default return) are the same array
    np.testing.assert_array_equal(reference.score_topk(*args_of(p), physical=physical), idx)
    return idx, sc, rows


# ----------------------------------------------------------------------------------------
# random cases
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "T,H,D,E,lens,top_k",
    [
        (3, 4, 32, 16, [40, 17, 64], 8),
        (2, 8, 64, 16, [100, 33], 32),
        (4, 2, 128, 8, [5, 9, 31, 24], 6),
        (2, 3, 32, 64, [130, 64], 20),
        (1, 1, 32, 4, [13], 13),
        (2, 5, 96, 16, [47, 48], 48),
    ],
)
def test_random_matches_brute(rng, T, H, D, E, lens, top_k):
    assert_matches_brute(make_problem(rng, T=T, H=H, D=D, E=E, lens=lens, top_k=top_k))


@pytest.mark.parametrize("E", [64, 256])
@pytest.mark.parametrize("top_k", [512, 1024, 2048])
def test_big_top_k_matches_brute(rng, E, top_k):
    lens = [top_k + E // 2 + 3, top_k - 5]  # one row with more entries than top_k, one short
    p = make_problem(rng, T=2, H=4, D=32, E=E, lens=lens, top_k=top_k)
    idx, sc, _ = assert_matches_brute(p)
    assert np.all(idx[0] >= 0)
    assert np.all(idx[1, top_k - 5:] == -1) and np.all(idx[1, : top_k - 5] >= 0)


@pytest.mark.parametrize("E", [16, 64])
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_lengths_off_block_edges(rng, E, delta):
    lens = [2 * E + delta, E + delta, 3 * E + delta]
    p = make_problem(rng, T=3, H=3, D=32, E=E, lens=lens, top_k=2 * E)
    idx, _, _ = assert_matches_brute(p)
    for t, n in enumerate(lens):
        chosen = idx[t][idx[t] >= 0]
        assert chosen.size == min(n, 2 * E) and chosen.max() < n


@pytest.mark.parametrize("E", [8, 64])
def test_physical_indices(rng, E):
    p = make_problem(rng, T=3, H=2, D=32, E=E, lens=[3 * E + 1, 5, 0], top_k=16)
    logical = reference.score_topk(*args_of(p))
    phys = assert_matches_brute(p, physical=True)[0]
    bt = p["block_table"]
    for t in range(3):
        for j in range(16):
            s = int(logical[t, j])
            assert phys[t, j] == (-1 if s < 0 else int(bt[t, s // E]) * E + s % E)
    assert np.all(phys[2] == -1) and np.all(phys[1, 5:] == -1)


def test_row_scores_chunking(rng):
    p = make_problem(rng, T=1, H=3, D=32, E=8, lens=[45], top_k=4)
    _, _, rows = brute_topk(*args_of(p))
    for chunk in (1, 7, 8, 45, 1000):
        got = reference.row_scores(p["q"][0], p["w"][0], p["keys_fp4"], p["key_scale"], p["key_gscale"],
                                   p["block_table"][0], 45, chunk=chunk)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, rows[0], rtol=1e-12, atol=1e-300)


def test_rows_sharing_a_table_match_brute_and_lone_rows(rng):
    # runs of equal block-table rows (a sequence's tokens) decode their keys once, for the
    # longest row of the run: the same bits as each row alone, and the brute force
    p = make_problem(rng, T=7, H=3, D=32, E=8, lens=[20, 0, 37, 5, 37, 12, 9], top_k=10)
    bt = p["block_table"]
    bt[0:2] = bt[2]  # rows 0-2: row 2's table (37 entries visible; ids past them garbage)
    bt[3] = bt[4]
    bt[5:7] = bt[4]  # rows 3-6: row 4's (also 37), a different permutation
    assert reference._runs_of_equal_rows(bt) == [(0, 3), (3, 7)]
    idx, sc, _ = assert_matches_brute(p)
    for t in range(7):
        one = {k: (v[t:t + 1] if k not in ("keys_fp4", "key_scale", "key_gscale", "top_k") else v) for k, v in p.items()}
        i1, s1 = reference.score_topk(*args_of(one), return_scores=True)
        np.testing.assert_array_equal(i1[0], idx[t])
        np.testing.assert_array_equal(s1[0].view(np.uint32), sc[t].view(np.uint32))


def test_runs_of_equal_rows():
    bt = np.array([[1, 2], [1, 2], [1, 3], [1, 2], [1, 2], [1, 2]], np.int32)
    assert reference._runs_of_equal_rows(bt) == [(0, 2), (2, 3), (3, 6)]
    assert reference._runs_of_equal_rows(bt[:1]) == [(0, 1)]


def test_row_keys_matches_brute_decode(rng):
    p = make_problem(rng, T=1, H=1, D=64, E=4, lens=[11], top_k=1)
    keys = reference.row_keys(p["keys_fp4"], p["key_scale"], p["key_gscale"], p["block_table"][0], 11, start=3)
    assert keys.shape == (8, 64) and keys.dtype == np.float32
    for i, s in enumerate(range(3, 11)):
        b, e = slot_of(p, 0, s)
        want = np.array(decode_key(p["keys_fp4"][b, e], p["key_scale"][b, e], p["key_gscale"][b]), np.float32)
        np.testing.assert_array_equal(keys[i].view(np.uint32), want.view(np.uint32))


# ----------------------------------------------------------------------------------------
# adversarial cases
# ----------------------------------------------------------------------------------------
def test_ties_go_to_the_lower_index(rng):
    """A key copied into several slots: equal scores, selected lowest index first, and a
    top_k boundary that cuts through the copies keeps the lowest ones."""
    p = make_problem(rng, T=1, H=4, D=32, E=8, lens=[60], top_k=60)
    p["key_gscale"][:] = np.float32(0.75)  # one global scale: equal bytes mean equal keys
    _, _, rows = brute_topk(*args_of(p))
    s0 = int(np.nanargmax(rows[0]))  # the best entry, copied into six other slots
    b0, e0 = slot_of(p, 0, s0)
    copies = sorted(set(rng.choice(np.delete(np.arange(60), s0), size=6, replace=False).tolist()))
    for s in copies:
        b, e = slot_of(p, 0, s)
        p["keys_fp4"][b, e] = p["keys_fp4"][b0, e0]
        p["key_scale"][b, e] = p["key_scale"][b0, e0]
    group = sorted(copies + [s0])
    p["top_k"] = 4  # cuts the tie group of 7
    idx, sc, _ = assert_matches_brute(p)
    assert idx[0].tolist() == group[:4]
    assert np.all(sc[0] == sc[0, 0])
    p["top_k"] = 10
    idx, _, _ = assert_matches_brute(p)
    assert idx[0, :7].tolist() == group


@pytest.mark.parametrize("chunk", [16384, 300])
def test_copies_of_a_key_score_bit_identically_at_the_model_shape(rng, chunk):
    """Hundreds of copies of one key across a row (H = 64, D = 128, rows and chunks cut
    through them): every copy gets the same float64 score, whatever order BLAS sums each
    column in, so the tie rule holds on the NumPy backend too."""
    n, E = 2000, 64
    p = make_problem(rng, T=2, H=64, D=128, E=E, lens=[n, n - 37], top_k=8)
    p["key_gscale"][:] = np.float32(0.5)  # one global scale: equal bytes mean equal keys
    p["block_table"][1] = p["block_table"][0]  # two rows of one table: the shared-keys path
    def row(t, chunk=16384):
        return reference.row_scores(p["q"][t], p["w"][t], p["keys_fp4"], p["key_scale"], p["key_gscale"],
                                    p["block_table"][t], int(p["valid_lens"][t]), chunk=chunk)

    s0 = int(np.nanargmax(row(0)))  # row 0's best key, copied into 300 other slots
    b0, e0 = slot_of(p, 0, s0)
    copies = rng.choice(np.delete(np.arange(n - 37), s0), size=300, replace=False)
    for s in copies:
        b, e = slot_of(p, 0, int(s))
        p["keys_fp4"][b, e] = p["keys_fp4"][b0, e0]
        p["key_scale"][b, e] = p["key_scale"][b0, e0]
    group = np.sort(np.append(copies, s0))
    for t in range(2):
        scores = row(t, chunk)
        assert np.all(scores[group] == scores[group[0]])
    idx = reference.score_topk(*args_of(p))
    assert idx[0].tolist() == group[:8].tolist()  # a tie of 301 at the top: the lowest indices
    scores = row(1)
    assert idx[1].tolist() == np.lexsort((np.arange(scores.size), -scores))[:8].tolist()


def test_same_codes_under_another_global_scale_are_another_key(rng):
    """A block's codes and scales copied into another block of a 4x larger global scale (a
    KeyPool's x and 4x): different keys, scored apart, as the brute force says."""
    p = make_problem(rng, T=2, H=4, D=32, E=8, lens=[32, 29], top_k=10, P=4)
    p["block_table"][:] = np.arange(4, dtype=np.int32)
    p["keys_fp4"][1] = p["keys_fp4"][0]
    p["key_scale"][1] = p["key_scale"][0]
    p["key_gscale"][1] = p["key_gscale"][0] * np.float32(4.0)
    assert_matches_brute(p)
    assert reference.key_groups(p["keys_fp4"], p["key_scale"], p["key_gscale"], p["block_table"][0], 16)[8:] \
        .tolist() != reference.key_groups(p["keys_fp4"], p["key_scale"], p["key_gscale"], p["block_table"][0], 16)[:8].tolist()


def test_reference_takes_a_float64_global_scale_as_its_float32_value(rng):
    """reference.* is called directly too: a float64 key_gscale (decoded as float32, as
    nvfp4.dequantize takes it) gives the float32 answer."""
    p = make_problem(rng, T=2, H=4, D=32, E=8, lens=[30, 17], top_k=6)
    want = reference.score_topk(*args_of(p), return_scores=True)
    p["key_gscale"] = p["key_gscale"].astype(np.float64)
    got = reference.score_topk(*args_of(p), return_scores=True)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_zero_keys_of_blocks_with_other_global_scales_tie_to_the_lower_index(rng):
    """All-zero keys score exactly 0 whatever their block's global scale: one plateau, the
    lowest indices first, though their bytes differ; the checker holds any answer to it."""
    p = make_problem(rng, T=1, H=4, D=32, E=8, lens=[32], top_k=20, P=4)
    p["block_table"][:] = np.arange(4, dtype=np.int32)
    p["keys_fp4"] &= 0x77  # every element >= 0 ...
    p["keys_fp4"] |= 0x11  # ... and > 0
    p["keys_fp4"][1:3] = 0
    p["key_scale"][1:3] = 0x38  # 1.0: the codes alone make the keys zero
    p["key_gscale"][2] = p["key_gscale"][1] * np.float32(8.0)
    p["q"][0] = np.abs(p["q"][0]) + np.float32(0.1)  # every other key scores above 0
    p["w"][0] = np.abs(p["w"][0]) + np.float32(0.1)
    idx, _, rows = assert_matches_brute(p)
    zeros = np.arange(8, 24)
    assert np.all(np.asarray(rows[0])[zeros] == 0)
    assert idx[0, -4:].tolist() == zeros[:4].tolist()  # 16 others score above 0, then the lowest zeros
    prob = testing.Problem(*(np.ascontiguousarray(p[k]) for k in testing.ARRAY_NAMES), p["top_k"])
    testing.check_topk(prob, idx)
    bad = idx.copy()
    bad[0, -1] = 16  # the other block's first zero key in place of entry 11 (each key group in order)
    with pytest.raises(AssertionError, match="zero-score plateau"):
        testing.check_topk(prob, bad)


def test_zero_plateau_takes_lowest_indices(rng):
    """Positive keys, negative queries: every dot < 0 and every score exactly 0, except a
    few entries whose keys are negated (positive scores)."""
    p = make_problem(rng, T=2, H=4, D=32, E=16, lens=[70, 50], top_k=12, L=5)
    p["keys_fp4"] &= np.uint8(0x77)  # clear both sign bits: keys >= 0
    p["q"] = -np.abs(p["q"]) - np.float32(0.01)
    p["w"] = np.abs(p["w"]) + np.float32(0.1)
    p["block_table"][1, :3] = p["block_table"][0, :3]  # both rows see the same first blocks
    pos = {0: [5, 41, 66], 1: [2, 30, 49]}
    for t, ss in pos.items():
        for s in ss:
            b, e = slot_of(p, t, s)
            p["keys_fp4"][b, e] |= np.uint8(0x88)
    idx, sc, rows = assert_matches_brute(p)
    for t, ss in pos.items():
        positives = [s for s in range(int(p["valid_lens"][t])) if rows[t][s] > 0]
        assert sorted(positives) == sorted(set(ss) | set(positives))
        assert set(idx[t, : len(positives)].tolist()) == set(positives)
        zeros = [s for s in range(int(p["valid_lens"][t])) if rows[t][s] == 0 and s not in positives]
        assert idx[t, len(positives):].tolist() == zeros[: 12 - len(positives)]
        assert np.all(sc[t, len(positives):] == 0)


def test_short_and_empty_rows(rng):
    p = make_problem(rng, T=4, H=2, D=32, E=16, lens=[7, 0, 16, 0], top_k=10)
    idx, sc, _ = assert_matches_brute(p)
    assert np.all(idx[0, :7] >= 0) and np.all(idx[0, 7:] == -1) and np.all(np.isneginf(sc[0, 7:]))
    assert np.all(idx[1] == -1) and np.all(np.isneginf(sc[1]))
    assert np.all(idx[3] == -1) and np.all(np.isneginf(sc[3]))
    assert np.all(idx[2] >= 0)


@pytest.mark.parametrize("where", ["q", "w"])
def test_nan_rows_select_nothing(rng, where):
    p = make_problem(rng, T=3, H=4, D=32, E=16, lens=[40, 40, 40], top_k=8)
    if where == "q":
        p["q"][1, 2, 17] = np.nan
    else:
        p["w"][1, 3] = np.nan
    idx, sc, rows = assert_matches_brute(p)
    assert all(math.isnan(v) for v in rows[1])
    assert np.all(idx[1] == -1) and np.all(np.isneginf(sc[1]))
    assert np.all(idx[0] >= 0) and np.all(idx[2] >= 0)


@pytest.mark.parametrize("nan_byte", [0x7F, 0xFF])
def test_nan_key_never_selected(rng, nan_byte):
    p = make_problem(rng, T=2, H=3, D=64, E=8, lens=[30, 30], top_k=30)
    p["block_table"][1] = p["block_table"][0]
    _, _, rows = brute_topk(*args_of(p))
    s_bad = int(np.nanargmax(rows[0]))  # poison the best entry
    b, e = slot_of(p, 0, s_bad)
    p["key_scale"][b, e, 2] = nan_byte
    idx, _, rows = assert_matches_brute(p)
    assert math.isnan(rows[0][s_bad])
    for t in range(2):
        assert s_bad not in idx[t].tolist()
        assert idx[t, 28] >= 0 and idx[t, 29] == -1  # 29 selectable entries, one -1


def test_nan_from_q_in_one_head_with_negative_dots(rng):
    """NaN in one head poisons every entry even where other heads' dots are negative."""
    p = make_problem(rng, T=1, H=2, D=32, E=8, lens=[12], top_k=3)
    p["q"][0, 0, 0] = np.nan
    idx = reference.score_topk(*args_of(p))
    assert np.all(idx == -1)


def test_negative_zero_scores_tie_with_zero(rng):
    """-0.0 and +0.0 are the same score: order among them is by index."""
    scores = np.array([0.0, -0.0, 1.0, -0.0, 0.0, np.nan, -2.0])
    idx, sc = reference.select_top_k(scores, 6)
    assert idx.tolist() == [2, 0, 1, 3, 4, 6]
    assert sc.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, -2.0]
    idx, sc = reference.select_top_k(scores, 9)
    assert idx.tolist()[6:] == [-1, -1, -1] and np.all(np.isneginf(sc[6:]))


def test_a_negative_score_below_float32_returns_as_plus_zero():
    """A negative float64 score too small for float32 rounds to -0 there: returned as +0.0,
    as every zero score is (README, "A zero score's sign"); the GPU paths fold -0 alike."""
    codes, scales, g = indexer.nvfp4.quantize(np.ones((1, 1, 32), np.float32))
    q = np.full((1, 1, 32), 1e-30, np.float32)
    w = np.full((1, 1), -1e-30, np.float32)  # score -32e-60: below float32's smallest subnormal
    for call in (reference.score_topk, lambda *a, **k: indexer.score_topk(*a, **k, backend="numpy")):
        idx, sc = call(q, w, codes, scales, np.full(1, g, np.float32), np.zeros((1, 1), np.int32),
                       np.ones(1, np.int32), 1, return_scores=True)
        assert idx.tolist() == [[0]] and sc[0, 0] == 0.0 and not np.signbit(sc[0, 0])


def test_keys_and_scores_past_float32_warn_nothing(rng):
    """A key decoding past float32's range (+-inf) and a score past it (+-inf) are defined
    corners (README, "Infinities"): no RuntimeWarning escapes, which a caller running with
    warnings as errors would get as an exception."""
    keys_past = make_problem(rng, T=2, H=2, D=32, E=8, lens=[12, 5], top_k=4)
    keys_past["key_gscale"][:] = 3e38  # e2m1 x e4m3 x 3e38 leaves float32 for most codes
    scores_past = make_problem(rng, T=2, H=2, D=32, E=8, lens=[12, 5], top_k=4)
    scores_past["key_gscale"][:] = 1e30
    scores_past["q"] *= np.float32(1e8)  # keys ~1e30-1e33 (finite), dots past 3.4e38
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for p in (keys_past, scores_past):
            idx, sc = reference.score_topk(*args_of(p), return_scores=True)
            indexer.score_topk(*args_of(p), backend="numpy")
    assert np.isposinf(sc[idx >= 0]).any()  # the case is the one meant: a score past float32


def test_to_physical(rng):
    bt = rng.integers(0, 50, size=(2, 4)).astype(np.int32)
    ind = np.array([[0, 9, 31, -1], [-1, -1, 17, 8]], np.int32)
    got = reference.to_physical(ind, bt, 8)
    want = [[bt[t, s // 8] * 8 + s % 8 if s >= 0 else -1 for s in row] for t, row in enumerate(ind.tolist())]
    assert got.dtype == np.int32
    assert got.tolist() == want


# ----------------------------------------------------------------------------------------
# indexer.score_topk with the NumPy backend
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("physical", [False, True])
def test_ops_numpy_equals_reference(rng, physical):
    p = make_problem(rng, T=3, H=4, D=64, E=16, lens=[50, 0, 33], top_k=20)
    want_idx, want_sc = reference.score_topk(*args_of(p), return_scores=True, physical=physical)
    got_idx, got_sc = indexer.score_topk(*args_of(p), backend="numpy", return_scores=True, physical=physical)
    np.testing.assert_array_equal(got_idx, want_idx)
    np.testing.assert_array_equal(got_sc, want_sc)
    only = ops.score_topk(*args_of(p), backend="numpy", physical=physical)
    assert isinstance(only, np.ndarray)
    np.testing.assert_array_equal(only, want_idx)
    kw = {k: p[k] for k in ORDER}
    np.testing.assert_array_equal(indexer.score_topk(**kw, backend="numpy", physical=physical), want_idx)


def test_ops_positional_order_matters(rng):
    """Swapping two same-typed positional arguments gives a different answer (or an error)."""
    p = make_problem(rng, T=2, H=4, D=32, E=16, lens=[40, 40], top_k=10)
    a = list(args_of(p))
    good = indexer.score_topk(*a, backend="numpy")
    a[2], a[3] = a[3], a[2]  # keys_fp4 <-> key_scale: shapes differ, must be rejected
    with pytest.raises(ValueError, match=r"^keys_fp4"):
        indexer.score_topk(*a, backend="numpy")
    assert good.shape == (2, 10)


@pytest.mark.skipif(indexer.ops.arrays.gpu_supported(), reason="'auto' picks CUDA where a GPU the kernels run on is present")
def test_ops_auto_on_cpu_is_numpy(rng):
    p = make_problem(rng, T=2, H=2, D=32, E=8, lens=[20, 9], top_k=5)
    np.testing.assert_array_equal(indexer.score_topk(*args_of(p)), reference.score_topk(*args_of(p)))
    with pytest.raises(RuntimeError, match=r"^backend='cuda'"):
        indexer.score_topk(*args_of(p), backend="cuda")


@pytest.mark.parametrize("kw,name", [({"backend": "bogus"}, "backend"), ({"precision": "bogus"}, "precision"),
                                     ({"backend": "NUMPY"}, "backend"), ({"precision": "fast16"}, "precision")])
def test_ops_rejects_bad_options(rng, kw, name):
    p = make_problem(rng, T=1, H=2, D=32, E=8, lens=[9], top_k=3)
    with pytest.raises(ValueError, match=rf"^{name}: expected one of"):
        indexer.score_topk(*args_of(p), **kw)


def test_ops_ragged_lists_are_refused_by_name(rng):
    p = make_problem(rng, T=2, H=2, D=32, E=8, lens=[9, 3], top_k=3)
    a = list(args_of(p))
    a[6] = [9, [3]]
    with pytest.raises(TypeError, match=r"^valid_lens: expected a NumPy or CuPy array, got a list"):
        indexer.score_topk(*a, backend="numpy")


@pytest.mark.parametrize("name", ["return_scores", "physical", "validate"])
@pytest.mark.parametrize("value", ["no", "False", None, 0, 1])
def test_ops_flags_must_be_bools(rng, name, value):
    """A truthy string (or 1, or None) must not silently pick a mode: refused by name."""
    p = make_problem(rng, T=1, H=2, D=32, E=8, lens=[9], top_k=3)
    with pytest.raises(TypeError, match=rf"^{name}: expected True or False"):
        indexer.score_topk(*args_of(p), backend="numpy", **{name: value})
    cu = np.array([0, 1], np.int32)
    a = args_of(p)
    with pytest.raises(TypeError, match=rf"^{name}: expected True or False"):
        indexer.score_topk_ragged(*a[:5], a[5], cu, a[6], a[7], backend="numpy", **{name: value})
    assert indexer.score_topk(*args_of(p), backend="numpy", **{name: np.bool_(True)}) is not None


# ----------------------------------------------------------------------------------------
# testing.random_problem through testing.check_topk
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [
        dict(T=3, H=4, D=32, E=16, top_k=16),
        dict(T=2, H=8, D=64, E=16, lens=40, top_k=50),
        dict(T=3, H=2, D=128, E=8, lens=[0, 17, 24], top_k=12),
        dict(T=4, H=4, D=32, E=64, lens=[200, 64, 65, 1], top_k=64, shared_blocks=True),
        dict(T=2, H=4, D=64, E=16, lens=100, top_k=8, gscale_spread=10.0, key_scale=1e-3),
    ],
)
@pytest.mark.parametrize("physical", [False, True])
def test_random_problem_passes_check_topk(rng, kw, physical):
    p = testing.random_problem(rng, **kw)
    indexer.validate.check_score_topk(*p.args())
    idx, sc = reference.score_topk(*p.args(), return_scores=True, physical=physical)
    testing.check_topk(p, idx, sc, physical=physical)
    testing.check_topk(p, idx, sc, physical=physical, tol=testing.TOL_FAST)
    if not physical:
        b_idx, _, _ = brute_topk(*p.args())
        np.testing.assert_array_equal(idx, b_idx)


# ----------------------------------------------------------------------------------------
# testing.adversarial_problem: every kind, against the brute force
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", testing.ADVERSARIAL_KINDS)
def test_adversarial_problems_match_brute(rng, kind):
    p = testing.adversarial_problem(kind, rng, H=4, D=32, E=16, T=6, top_k=24)
    assert p.notes["kind"] == kind
    idx, sc = reference.score_topk(*p.args(), return_scores=True)
    b_idx, b_sc, rows = brute_topk(*p.args())
    np.testing.assert_array_equal(idx, b_idx)
    pad = b_idx < 0
    assert np.all(np.isneginf(sc[pad]))
    assert np.all(np.abs(sc[~pad].astype(np.float64) - b_sc[~pad]) <= 2.0**-23 * np.abs(b_sc[~pad]) + 1e-30)
    if kind == "nan":
        assert np.all(idx[:2] == -1)
        assert any(math.isnan(v) for v in rows[2]) and not all(math.isnan(v) for v in rows[2])
    elif kind == "zero_plateau":
        assert all(sum(v == 0 for v in r) > len(r) // 2 for r in rows)
    elif kind == "ties":
        E = p.keys_fp4.shape[1]
        assert rows[0][:E] == rows[0][E:2 * E]  # blocks 0 and 1 hold identical keys
        for t in range(p.q.shape[0]):
            for j, s in enumerate(idx[t]):  # a copy in block 1 is never chosen before its twin
                if E <= s < 2 * E:
                    assert s - E in idx[t, :j].tolist()


def test_adversarial_problem_rejects_unknown_kind(rng):
    with pytest.raises(ValueError, match=r"^kind: expected one of"):
        testing.adversarial_problem("bogus", rng)
