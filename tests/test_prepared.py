"""indexer.prepare on the NumPy backend: the same answers as score_topk / score_topk_ragged,
and every argument that does not match what was prepared refused, named."""

import numpy as np
import pytest

import indexer
from indexer import reference, testing
from test_ragged import grouped_problem


def problem(seed, **kw):
    kw = {"T": 3, "H": 8, "D": 64, "E": 16, "top_k": 20, **kw}
    return testing.random_problem(np.random.default_rng(seed), **kw)


def test_calls_equal_score_topk_on_fresh_problems_of_the_prepared_shapes():
    first = problem(1)
    step = indexer.prepare(*first.args(), backend="numpy", return_scores=True)
    assert step.backend == "numpy" and step.top_k == 20 and step.shapes["q"] == (3, 8, 64)
    for seed in (1, 2, 3):
        p = problem(seed, L=first.block_table.shape[1], P=first.keys_fp4.shape[0],
                    lens=np.random.default_rng(seed).integers(0, 20, size=3))
        got, got_sc = step(*p.arrays())
        want, want_sc = reference.score_topk(*p.args(), return_scores=True)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_sc, want_sc)
        testing.check_topk(p, got, got_sc)


def test_memory_mapped_arrays_are_numpy_arrays_both_ways(tmp_path):
    # a pool read with np.load(mmap_mode=...) passes a call prepared on plain arrays, and back
    p = problem(4)
    mapped = []
    for name, a in zip(testing.ARRAY_NAMES, p.arrays()):
        m = np.lib.format.open_memmap(tmp_path / f"{name}.npy", mode="w+", dtype=a.dtype, shape=a.shape)
        m[...] = a
        mapped.append(m)
    want = reference.score_topk(*p.args())
    for prepared_on, called_with in ((p.arrays(), mapped), (mapped, p.arrays())):
        step = indexer.prepare(*prepared_on, p.top_k, backend="numpy")
        np.testing.assert_array_equal(step(*called_with), want)
    with pytest.raises(TypeError, match="^q: expected a numpy.ndarray as prepared, got builtins.list$"):
        step(p.q.tolist(), *p.arrays()[1:])


def test_physical_and_out_are_taken_as_score_topk_takes_them():
    p = problem(4)
    step = indexer.prepare(*p.args(), backend="numpy", physical=True)
    out = np.full((3, 20), 7, dtype=np.int32)
    assert step(*p.arrays(), out=out) is out
    np.testing.assert_array_equal(out, indexer.score_topk(*p.args(), backend="numpy", physical=True))
    testing.check_topk(p, out, physical=True)
    with pytest.raises(ValueError, match="^out: expected int32 of shape"):
        step(*p.arrays(), out=np.zeros((3, 19), dtype=np.int32))


def test_grouped_calls_equal_score_topk_ragged():
    rng = np.random.default_rng(5)
    args = grouped_problem(rng, [3, 0, 2])
    q, w, k, s, g, table, cu, lens = args
    step = indexer.prepare(q, w, k, s, g, table, lens, 12, cu_seqlens_q=cu, backend="numpy", return_scores=True)
    got, sc = step(q, w, k, s, g, table, lens, cu_seqlens_q=cu)
    want, want_sc = indexer.score_topk_ragged(*args, 12, backend="numpy", return_scores=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sc, want_sc)
    with pytest.raises(TypeError, match="^cu_seqlens_q: this call was prepared with cu_seqlens_q"):
        step(q, w, k, s, g, table, lens)
    plain = indexer.prepare(*problem(6).args(), backend="numpy")
    with pytest.raises(TypeError, match="^cu_seqlens_q: this call was prepared without"):
        plain(*problem(6).arrays(), cu_seqlens_q=cu)


@pytest.mark.parametrize("which, change, error, message", [
    (0, lambda x: x[:2], ValueError, r"^q: expected shape \(3, 8, 64\) as prepared, got \(2, 8, 64\)"),
    (1, lambda x: x.astype(np.float64), TypeError, "^w: expected dtype float32 as prepared, got float64"),
    (5, lambda x: x.tolist(), TypeError, "^block_table: expected a numpy.ndarray as prepared, got builtins.list"),
    (6, lambda x: x[:, None], ValueError, r"^valid_lens: expected shape \(3,\) as prepared"),
])
def test_arrays_unlike_the_prepared_ones_are_refused_by_name(which, change, error, message):
    p = problem(7)
    step = indexer.prepare(*p.args(), backend="numpy")
    given = list(p.arrays())
    given[which] = change(given[which])
    with pytest.raises(error, match=message):
        step(*given)


def test_prepare_checks_what_score_topk_checks():
    p = problem(8)
    with pytest.raises(ValueError, match="^top_k: expected 1 <= top_k"):
        indexer.prepare(*p.arrays(), 0, backend="numpy")
    with pytest.raises(ValueError, match="^precision: expected one of"):
        indexer.prepare(*p.args(), backend="numpy", precision="half")
    with pytest.raises(TypeError, match="^workspace: expected an indexer.Workspace"):
        indexer.prepare(*p.args(), backend="numpy", workspace=object())
    with pytest.raises(ValueError, match="^workspace_budget: expected a positive number"):
        indexer.prepare(*p.args(), backend="numpy", workspace_budget=0)
    with pytest.raises(ValueError, match="^backend: expected one of"):
        indexer.prepare(*p.args(), backend="tpu")
    bad = list(p.arrays())
    bad[4] = bad[4].copy()
    bad[4][int(p.block_table[0, 0])] = -1.0  # a visible block's global scale
    with pytest.raises(ValueError, match="^key_gscale: expected finite values > 0"):
        indexer.prepare(*bad, p.top_k, backend="numpy")
    with pytest.raises(TypeError, match="^q: expected dtype float32, float16, bfloat16 or float8_e4m3fn, got float64"):
        indexer.prepare(p.q.astype(np.float64), *p.arrays()[1:], p.top_k, backend="numpy")
    with pytest.raises(TypeError, match="^w: expected a NumPy, CuPy or DLPack CUDA array, got list"):
        indexer.prepare(p.q, p.w.tolist(), *p.arrays()[2:], p.top_k, backend="numpy")
    with pytest.raises(TypeError, match="^graphs: expected True or False, got str"):
        indexer.prepare(*p.args(), backend="numpy", graphs="yes")
    step = indexer.prepare(*p.args(), backend="numpy")
    for flag in ("no", None, 0, 1):  # per call too: bool("no") would run the validated call
        with pytest.raises(TypeError, match="^validate: expected True or False"):
            step(*p.arrays(), validate=flag)
    q, w, k, s, g, _, _, _ = grouped_problem(np.random.default_rng(11), [2])
    with pytest.raises(ValueError, match="^block_table: expected at least one sequence"):
        indexer.prepare(q[:0], w[:0], k, s, g, np.zeros((0, 4), dtype=np.int32), np.zeros(0, dtype=np.int32), 5,
                        cu_seqlens_q=np.zeros(1, dtype=np.int32), backend="numpy")


def test_a_numpy_call_checks_values_every_time():
    p = problem(9)
    step = indexer.prepare(*p.args(), backend="numpy")
    bad = list(p.arrays())
    bad[6] = np.full(3, 10_000, dtype=np.int32)
    with pytest.raises(ValueError, match="^valid_lens: expected 0 <= n <= L\\*E"):
        step(*bad)


def test_repr_names_the_shapes_and_owns_a_workspace():
    step = indexer.prepare(*problem(10).args(), backend="numpy")
    assert "q=(3, 8, 64)" in repr(step) and "top_k=20" in repr(step)
    assert isinstance(step.workspace, indexer.Workspace)
    ws = indexer.Workspace()
    assert indexer.prepare(*problem(10).args(), backend="numpy", workspace=ws).workspace is ws


def test_a_prepared_grouped_call_on_numpy_writes_out():
    args = grouped_problem(np.random.default_rng(5), [3, 0, 2])
    q, w, k, s, g, table, cu, lens = args
    step = indexer.prepare(q, w, k, s, g, table, lens, 12, cu_seqlens_q=cu, backend="numpy")
    out = np.zeros((5, 12), np.int32)
    assert step(q, w, k, s, g, table, lens, cu_seqlens_q=cu, out=out) is out
    np.testing.assert_array_equal(out, indexer.score_topk_ragged(*args, 12, backend="numpy"))
