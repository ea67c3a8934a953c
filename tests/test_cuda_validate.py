"""Validation of device arrays: the value checks run as one kernel (``indexer.device_checks``)
and must accept and reject exactly what the NumPy form does, with the same messages."""

from __future__ import annotations

import numpy as np
import pytest

from gpu import requires_gpu
from indexer import validate
from test_validate import CATALOGUE, ORDER, _poke, good_args

pytestmark = requires_gpu


def _outcome(fn):
    try:
        return ("ok", fn())
    except (TypeError, ValueError) as exc:
        return (type(exc).__name__, str(exc))


def _on_device(a):
    """The arguments as CuPy arrays of the same layout (a strided or Fortran-order host array
    stays so on the device: cp.asarray alone would make it C-contiguous)."""
    import cupy as cp

    def move(x):
        if not isinstance(x, np.ndarray):
            return x
        if x.flags.c_contiguous:
            return cp.asarray(x)
        if x.flags.f_contiguous:
            return cp.asfortranarray(cp.asarray(x))
        return cp.repeat(cp.asarray(np.ascontiguousarray(x))[..., None], 2, axis=-1)[..., 0]

    moved = {k: move(v) for k, v in a.items()}
    assert all(moved[k].flags.c_contiguous == v.flags.c_contiguous for k, v in a.items() if isinstance(v, np.ndarray))
    return moved


def _check(a):
    return _outcome(lambda: validate.check_score_topk(*(a[k] for k in ORDER)))


@pytest.mark.parametrize("case,mutate,exc,name", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_catalogue_same_outcome_on_device(case, mutate, exc, name):
    a = mutate(good_args())
    host = _check(a)
    assert host[0] == exc.__name__
    assert _check(_on_device(a)) == host


def _random_case(rng):
    """Tables of random shape with, at random, lengths out of range, bad global scales and bad
    block ids, visible or not (several at once: the first one in row-major order is named)."""
    T, L, E, P = (int(rng.integers(1, 9)), int(rng.integers(1, 40)), int(rng.choice([1, 3, 16, 64])),
                  int(rng.integers(1, 50)))
    a = good_args(int(rng.integers(1 << 30)), t=T, p=P, e=E, l_=1, lens=[0] * T)
    a["block_table"] = rng.integers(0, P, (T, L), dtype=np.int32)
    a["valid_lens"] = rng.integers(0, L * E + 1, T, dtype=np.int32)
    for _ in range(int(rng.integers(0, 4))):
        a["block_table"][rng.integers(T), rng.integers(L)] = rng.choice([-1, P, P + 7, -(2**31), 2**31 - 1])
    if rng.random() < 0.3:
        a["valid_lens"][rng.integers(T)] = rng.choice([-1, L * E + 1, -(2**31), 2**31 - 1])
    if rng.random() < 0.3:
        a["key_gscale"][rng.integers(P)] = rng.choice([0.0, -0.0, -1.0, np.nan, np.inf, -np.inf])
    return a


def test_random_tables_same_outcome_on_device():
    rng = np.random.default_rng(7)
    kinds = set()
    for _ in range(300):
        a = _random_case(rng)
        host = _check(a)
        kinds.add(host[0] if host[0] == "ok" else host[1].split(":")[0])
        assert _check(_on_device(a)) == host
    assert kinds >= {"ok", "valid_lens", "key_gscale", "block_table"}  # every outcome was met


def test_first_failures_positions():
    import cupy as cp

    from indexer import device_checks

    lens = cp.asarray(np.array([5, -1, 7, 99, 0], np.int32))
    bt = cp.asarray(np.array([[0, 9, 9], [9, 9, 9], [0, 1, -3], [2, 0, 1], [9, 9, 9]], np.int32))
    gs = cp.asarray(np.array([1.0, 2.0, np.nan, 0.0], np.float32))
    got = device_checks.first_failures(valid_lens=lens, max_len=9, key_gscale=gs, block_table=bt, E=3)
    # lens: rows 1 and 3 out of [0, 9]; blocks: row 0 sees 2 (id 9 at cell 1), row 2 sees 3
    # (-3 at cell 8), row 3 all 3, row 1 and 4 none; scales: 2 (NaN) and 3 (zero)
    assert got == (1, 2, 1, None)
    assert device_checks.first_failures(key_gscale=gs[:2]) == (None, None, None, None)


@pytest.mark.parametrize("cu,T,bad", [
    ([0, 2, 2, 5], 5, None), ([0], 0, None), ([1, 2, 5], 5, 0), ([0, 2, 4], 5, 2), ([0, 3, 2, 5], 5, 2),
    ([0, 3, 2, 1, 5], 5, 2),
])
def test_cu_seqlens_on_device(cu, T, bad):
    import cupy as cp

    from indexer import device_checks

    cu_d = cp.asarray(np.array(cu, np.int32))
    assert device_checks.first_failures(cu_seqlens=cu_d, T=T)[3] == bad
    bt = np.zeros((len(cu) - 1, 2), np.int32)
    host = _outcome(lambda: validate.check_cu_seqlens(np.array(cu, np.int32), bt, T))
    assert _outcome(lambda: validate.check_cu_seqlens(cu_d, cp.asarray(bt), T)) == host
    assert (host[0] == "ok") == (bad is None)


def test_large_table_checked_fully():
    """A prefill-sized per-token table (4,096 rows x 4,112 blocks): a bad id in the last
    visible cell of the last row is found, one past it is not looked at."""
    T, L, E, P = 4096, 4112, 64, 5000
    lens = np.full(T, L * E - 100, np.int32)
    bt = np.random.default_rng(0).integers(0, P, (T, L), dtype=np.int32)
    args = good_args(0, t=1, p=P, e=E, l_=1, lens=[0])
    a = dict(args, q=np.zeros((T, 4, 64), np.float32) + 1, w=np.ones((T, 4), np.float32),
             block_table=bt, valid_lens=lens)
    d = _on_device(a)
    assert _check(d)[0] == "ok"
    d["block_table"][T - 1, L - 1] = -1
    assert _check(d) == _check(_poke("block_table", (T - 1, L - 1), -1)(a))
    d["valid_lens"][T - 1] = L * E - E  # the last block no longer visible
    assert _check(d)[0] == "ok"
