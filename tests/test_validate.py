"""Argument checks of ``indexer.validate.check_score_topk`` and ``indexer.score_topk``.

Every malformed input must raise ValueError (TypeError for a wrong type) whose message
starts with the offending argument's name; inputs are never modified.
"""

from __future__ import annotations

import numpy as np
import pytest

import indexer
from indexer import validate
from indexer.validate import MAX_HEAD_DIM, MAX_HEADS, MAX_TOP_K

T, H, D, P, E, L = 3, 4, 64, 6, 16, 4
ORDER = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens", "top_k")


def good_args(seed=0, *, t=T, h=H, d=D, p=P, e=E, l_=L, lens=(40, 0, 64)):
    rng = np.random.default_rng(seed)
    bt = np.stack([rng.permutation(p)[:l_] for _ in range(t)]).astype(np.int32)
    lens = np.array(lens, dtype=np.int32)
    for i in range(t):  # ids past the visible blocks: garbage that must be accepted
        used = -(-int(lens[i]) // e)
        bt[i, used:] = -1 if i % 2 else p + 100
    return dict(
        q=rng.standard_normal((t, h, d)).astype(np.float32),
        w=rng.standard_normal((t, h)).astype(np.float32),
        keys_fp4=rng.integers(0, 256, (p, e, d // 2), dtype=np.uint8),
        key_scale=rng.integers(0x30, 0x40, (p, e, d // 16), dtype=np.uint8),
        key_gscale=rng.uniform(0.5, 2.0, p).astype(np.float32),
        block_table=bt,
        valid_lens=lens,
        top_k=8,
    )


def _noncontig(x):
    """Same shape, same dtype, same values, not C-contiguous."""
    big = np.repeat(x[..., None], 2, axis=-1)
    out = big[..., 0]
    assert out.shape == x.shape and not out.flags.c_contiguous
    return out


def _set(name, value):
    def f(a):
        a[name] = value(a) if callable(value) else value
        return a
    return f


def _poke(name, index, value):
    def f(a):
        a[name] = a[name].copy()
        a[name][index] = value
        return a
    return f


def _resize_d(d):
    def f(a):
        rng = np.random.default_rng(1)
        a["q"] = rng.standard_normal((T, H, d)).astype(np.float32)
        a["keys_fp4"] = rng.integers(0, 256, (P, E, d // 2), dtype=np.uint8)
        a["key_scale"] = rng.integers(0x30, 0x40, (P, E, max(d // 16, 1)), dtype=np.uint8)
        return a
    return f


def _heads(h):
    def f(a):
        a["q"] = np.ones((T, h, D), np.float32)
        a["w"] = np.ones((T, h), np.float32)
        return a
    return f


# (id, mutation, exception, argument name)
CATALOGUE = [
    # q
    ("q-float64", _set("q", lambda a: a["q"].astype(np.float64)), TypeError, "q"),
    ("q-int16", _set("q", lambda a: a["q"].astype(np.int16)), TypeError, "q"),
    ("q-uint16", _set("q", lambda a: a["q"].view(np.uint16)[..., ::2].copy()), TypeError, "q"),  # not a bfloat16's bits
    ("q-rank2", _set("q", lambda a: a["q"].reshape(T, H * D)), ValueError, "q"),
    ("q-noncontig", _set("q", lambda a: _noncontig(a["q"])), ValueError, "q"),
    ("q-fortran", _set("q", lambda a: np.asfortranarray(a["q"])), ValueError, "q"),
    ("q-list", _set("q", lambda a: a["q"].tolist()), TypeError, "q"),
    ("q-T0", _set("q", lambda a: a["q"][:0].copy()), ValueError, "q"),
    ("D-not-mult-32", _resize_d(48), ValueError, "q"),
    ("D-16", _resize_d(16), ValueError, "q"),
    ("D-too-big", _resize_d(MAX_HEAD_DIM + 32), ValueError, "q"),
    ("H-too-many", _heads(MAX_HEADS + 1), ValueError, "q"),
    # w
    ("w-float64", _set("w", lambda a: a["w"].astype(np.float64)), TypeError, "w"),
    ("w-rank3", _set("w", lambda a: a["w"][..., None]), ValueError, "w"),
    ("w-wrong-T", _set("w", lambda a: np.ones((T + 1, H), np.float32)), ValueError, "w"),
    ("w-wrong-H", _set("w", lambda a: np.ones((T, H - 1), np.float32)), ValueError, "w"),
    ("w-noncontig", _set("w", lambda a: _noncontig(a["w"])), ValueError, "w"),
    # keys_fp4
    ("keys-int8", _set("keys_fp4", lambda a: a["keys_fp4"].view(np.int8)), TypeError, "keys_fp4"),
    ("keys-float32", _set("keys_fp4", lambda a: a["keys_fp4"].astype(np.float32)), TypeError, "keys_fp4"),
    ("keys-rank2", _set("keys_fp4", lambda a: a["keys_fp4"].reshape(P * E, D // 2)), ValueError, "keys_fp4"),
    ("keys-wrong-D", _set("keys_fp4", lambda a: np.zeros((P, E, D), np.uint8) + 1), ValueError, "keys_fp4"),
    ("keys-noncontig", _set("keys_fp4", lambda a: _noncontig(a["keys_fp4"])), ValueError, "keys_fp4"),
    ("keys-E0", lambda a: _set("key_scale", np.ones((P, 0, D // 16), np.uint8))(
        _set("keys_fp4", np.ones((P, 0, D // 2), np.uint8))(a)), ValueError, "keys_fp4"),
    # key_scale
    ("scale-float32", _set("key_scale", lambda a: a["key_scale"].astype(np.float32)), TypeError, "key_scale"),
    ("scale-rank2", _set("key_scale", lambda a: a["key_scale"].reshape(P, -1)), ValueError, "key_scale"),
    ("scale-D/32", _set("key_scale", lambda a: a["key_scale"][:, :, :D // 32].copy()), ValueError, "key_scale"),
    ("scale-wrong-P", _set("key_scale", lambda a: a["key_scale"][:-1].copy()), ValueError, "key_scale"),
    ("scale-wrong-E", _set("key_scale", lambda a: a["key_scale"][:, :-1].copy()), ValueError, "key_scale"),
    ("scale-noncontig", _set("key_scale", lambda a: _noncontig(a["key_scale"])), ValueError, "key_scale"),
    # key_gscale
    ("gscale-float64", _set("key_gscale", lambda a: a["key_gscale"].astype(np.float64)), TypeError, "key_gscale"),
    ("gscale-scalar", _set("key_gscale", 1.0), TypeError, "key_gscale"),
    ("gscale-rank2", _set("key_gscale", lambda a: a["key_gscale"][:, None].copy()), ValueError, "key_gscale"),
    ("gscale-wrong-P", _set("key_gscale", lambda a: np.ones(P + 1, np.float32)), ValueError, "key_gscale"),
    ("gscale-noncontig", _set("key_gscale", lambda a: _noncontig(a["key_gscale"])), ValueError, "key_gscale"),
    ("gscale-zero", _poke("key_gscale", 2, 0.0), ValueError, "key_gscale"),
    ("gscale-negzero", _poke("key_gscale", 2, -0.0), ValueError, "key_gscale"),
    ("gscale-negative", _poke("key_gscale", 0, -1.5), ValueError, "key_gscale"),
    ("gscale-nan", _poke("key_gscale", 5, np.nan), ValueError, "key_gscale"),
    ("gscale-inf", _poke("key_gscale", 1, np.inf), ValueError, "key_gscale"),
    # block_table
    ("bt-int64", _set("block_table", lambda a: a["block_table"].astype(np.int64)), TypeError, "block_table"),
    ("bt-uint32", _set("block_table", lambda a: a["block_table"].astype(np.uint32)), TypeError, "block_table"),
    ("bt-rank1", _set("block_table", lambda a: a["block_table"].reshape(-1)), ValueError, "block_table"),
    ("bt-wrong-T", _set("block_table", lambda a: np.zeros((T + 1, L), np.int32)), ValueError, "block_table"),
    ("bt-L0", _set("block_table", np.zeros((T, 0), np.int32)), ValueError, "block_table"),
    ("bt-L*E-overflow", lambda a: _set("block_table", np.zeros((T, 2**20), np.int32))(
        _set("key_scale", np.ones((P, 2**11, D // 16), np.uint8))(
            _set("keys_fp4", np.ones((P, 2**11, D // 2), np.uint8))(a))), ValueError, "block_table"),
    ("bt-noncontig", _set("block_table", lambda a: _noncontig(a["block_table"])), ValueError, "block_table"),
    ("bt-id-P", _poke("block_table", (0, 2), P), ValueError, "block_table"),  # entry 32..39 visible
    ("bt-id-neg", _poke("block_table", (2, 3), -1), ValueError, "block_table"),  # row 2 sees all 4 blocks
    ("bt-id-huge", _poke("block_table", (0, 0), 2**31 - 1), ValueError, "block_table"),
    # valid_lens
    ("lens-int64", _set("valid_lens", lambda a: a["valid_lens"].astype(np.int64)), TypeError, "valid_lens"),
    ("lens-list", _set("valid_lens", lambda a: a["valid_lens"].tolist()), TypeError, "valid_lens"),
    ("lens-rank2", _set("valid_lens", lambda a: a["valid_lens"][:, None].copy()), ValueError, "valid_lens"),
    ("lens-wrong-T", _set("valid_lens", np.array([1, 2], np.int32)), ValueError, "valid_lens"),
    ("lens-noncontig", _set("valid_lens", lambda a: _noncontig(a["valid_lens"])), ValueError, "valid_lens"),
    ("lens-negative", _poke("valid_lens", 1, -1), ValueError, "valid_lens"),
    ("lens-too-long", _poke("valid_lens", 1, L * E + 1), ValueError, "valid_lens"),
    # top_k
    ("topk-0", _set("top_k", 0), ValueError, "top_k"),
    ("topk-negative", _set("top_k", -3), ValueError, "top_k"),
    ("topk-too-big", _set("top_k", MAX_TOP_K + 1), ValueError, "top_k"),
    ("topk-float", _set("top_k", 8.0), TypeError, "top_k"),
    ("topk-bool", _set("top_k", True), TypeError, "top_k"),
    ("topk-npbool", _set("top_k", np.bool_(True)), TypeError, "top_k"),
    ("topk-str", _set("top_k", "8"), TypeError, "top_k"),
    ("topk-array", _set("top_k", np.array([8])), TypeError, "top_k"),
]


def _call(fn, a):
    args = tuple(a[k] for k in ORDER)
    if fn == "check":
        return validate.check_score_topk(*args)
    return indexer.score_topk(*args, backend="numpy")


def test_catalogue_is_large_and_distinct():
    ids = [c[0] for c in CATALOGUE]
    assert len(ids) == len(set(ids)) >= 25
    assert {c[3] for c in CATALOGUE} == set(ORDER)  # every argument is covered


@pytest.mark.parametrize("fn", ["check", "score_topk"])
@pytest.mark.parametrize("case,mutate,exc,name", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_malformed_input_rejected(fn, case, mutate, exc, name):
    a = mutate(good_args())
    with pytest.raises(exc, match=rf"^{name}: ") as info:
        _call(fn, a)
    assert type(info.value) is exc  # TypeError is not a ValueError subclass, nor vice versa
    assert len(str(info.value)) > len(name) + 20  # says what was expected, not just the name


@pytest.mark.parametrize("fn", ["check", "score_topk"])
def test_good_arguments_accepted(fn):
    a = good_args()
    out = _call(fn, a)
    if fn == "check":
        assert out == validate.Problem(T=T, H=H, D=D, P=P, E=E, L=L, top_k=8)
        assert out.max_len == L * E
    else:
        assert out.shape == (T, 8) and out.dtype == np.int32


@pytest.mark.parametrize("fn", ["check", "score_topk"])
@pytest.mark.parametrize(
    "case,mutate",
    [
        ("block id past visible blocks", _poke("block_table", (0, 3), P)),
        ("block id -1 past visible blocks", _poke("block_table", (0, 3), -1)),
        ("empty row with garbage ids", lambda a: _poke("block_table", (1, slice(None)), 2**31 - 1)(a)),
        ("valid_lens = L*E", lambda a: _poke("block_table", 1, np.array([5, 0, 3, 1], np.int32))(
            _poke("valid_lens", 1, L * E)(a))),
        ("valid_lens all zero", _set("valid_lens", np.zeros(T, np.int32))),
        ("top_k = MAX_TOP_K", _set("top_k", MAX_TOP_K)),
        ("top_k = 1", _set("top_k", 1)),
        ("top_k numpy int", _set("top_k", np.int64(5))),
        ("D = 32", _resize_d(32)),
        ("D = MAX_HEAD_DIM", _resize_d(MAX_HEAD_DIM)),
        ("H = MAX_HEADS", _heads(MAX_HEADS)),
        ("H = 1", _heads(1)),
    ],
)
def test_edge_inputs_accepted(fn, case, mutate):
    a = mutate(good_args())
    out = _call(fn, a)
    if fn == "score_topk":
        assert out.shape == (T, int(a["top_k"]))


def test_visible_block_boundary():
    """Row 0 sees 40 entries = blocks 0..2 (block 2 partially): block 2 is checked, 3 is not."""
    a = _poke("block_table", (0, 3), -5)(good_args())
    validate.check_score_topk(*(a[k] for k in ORDER))
    a = _poke("block_table", (0, 2), -5)(good_args())
    with pytest.raises(ValueError, match=r"^block_table: .*got -5 at row 0, logical block 2"):
        validate.check_score_topk(*(a[k] for k in ORDER))


@pytest.mark.parametrize("values", [True, False])
def test_longest_row_is_bounded_with_a_margin_under_2_31(values):
    """L * E up to MAX_ROW_ENTRIES (2**31 - 2**20) is accepted, one block more refused, even
    without the value checks: the kernels' 32-bit row arithmetic must not wrap."""
    e = 2**16
    l_ok = validate.MAX_ROW_ENTRIES // e
    assert l_ok * e == validate.MAX_ROW_ENTRIES
    for l_, ok in ((l_ok, True), (l_ok + 1, False)):
        a = good_args(t=1, p=1, e=e, l_=1, lens=(5,))
        a["block_table"] = np.zeros((1, l_), dtype=np.int32)
        if ok:
            assert validate.check_score_topk(*(a[k] for k in ORDER), values=values).L == l_
        else:
            with pytest.raises(ValueError, match=r"^block_table: L \* E = 2146500608 entries per row exceeds"):
                validate.check_score_topk(*(a[k] for k in ORDER), values=values)


def test_a_pool_of_2_31_entries_is_refused_for_its_int32_physical_indices(tmp_path):
    """P * E = 2**31 exactly (physical indices block * E + slot must fit int32): refused on
    shapes alone. The pool arrays are sparse memory maps (32 GiB of address space, no data)."""
    P, E, d = 2**16, 2**15, 32
    try:
        keys = np.memmap(tmp_path / "k", dtype=np.uint8, mode="w+", shape=(P, E, d // 2))
        scales = np.memmap(tmp_path / "s", dtype=np.uint8, mode="w+", shape=(P, E, d // 16))
    except (OSError, ValueError) as exc:  # a file system without sparse files
        pytest.skip(f"no sparse 32 GiB file here: {exc}")
    a = good_args(t=1, d=d, p=1, e=E, l_=1, lens=(5,))
    a.update(keys_fp4=keys, key_scale=scales, key_gscale=np.ones(P, np.float32))
    with pytest.raises(ValueError, match=r"^keys_fp4: P \* E = 2147483648 pool entries exceeds the int32 range"):
        validate.check_score_topk(*(a[k] for k in ORDER), values=False)


def test_values_false_skips_value_checks():
    a = _poke("valid_lens", 0, -4)(_poke("key_gscale", 0, np.nan)(good_args()))
    prob = validate.check_score_topk(*(a[k] for k in ORDER), values=False)
    assert (prob.T, prob.H, prob.D, prob.P, prob.E, prob.L) == (T, H, D, P, E, L)
    with pytest.raises(ValueError, match=r"^valid_lens: "):
        validate.check_score_topk(*(a[k] for k in ORDER), values=True)
    # shape checks stay on
    b = _set("q", lambda a: a["q"].astype(np.float64))(good_args())
    with pytest.raises(TypeError, match=r"^q: "):
        validate.check_score_topk(*(b[k] for k in ORDER), values=False)


def test_check_top_k():
    assert validate.check_top_k(np.int32(7)) == 7
    assert type(validate.check_top_k(np.int64(7))) is int
    with pytest.raises(TypeError, match=r"^top_k: expected an int, got float"):
        validate.check_top_k(1.0)


def _snapshot(a):
    return {k: (np.array(v, copy=True), v.dtype, v.shape, v.strides) for k, v in a.items() if isinstance(v, np.ndarray)}


def _assert_unchanged(a, snap):
    for k, (copy, dtype, shape, strides) in snap.items():
        v = a[k]
        assert v.dtype == dtype and v.shape == shape and v.strides == strides, k
        assert v.tobytes() == copy.tobytes(), f"{k} was modified"


@pytest.mark.parametrize("fn", ["check", "score_topk"])
def test_inputs_unchanged_after_failed_call(fn):
    a = _poke("block_table", (2, 3), P)(good_args())  # fails at the last check
    a["q"][0, 1, 2] = np.nan
    snap = _snapshot(a)
    with pytest.raises(ValueError, match=r"^block_table"):
        _call(fn, a)
    _assert_unchanged(a, snap)


@pytest.mark.parametrize("physical", [False, True])
def test_inputs_unchanged_after_successful_call(physical):
    a = good_args()
    a["q"][1, 0, 0] = np.nan  # a NaN row must not be "cleaned" in place
    a["w"][0, 0] = -a["w"][0, 0]
    snap = _snapshot(a)
    args = tuple(a[k] for k in ORDER)
    idx, sc = indexer.score_topk(*args, backend="numpy", return_scores=True, physical=physical)
    assert idx.shape == sc.shape == (T, 8)
    validate.check_score_topk(*args)
    _assert_unchanged(a, snap)
