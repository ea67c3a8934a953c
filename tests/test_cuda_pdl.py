"""The select kernels launched to overlap their predecessor (indexer/launch.py) give the
same bits as ordinary launches, eagerly and replayed from a CUDA graph, on every select
route (all-pairs rank, binned rank, the one-CTA sort, the overflow fallback, the short-row
select, the exact path's histogram) and on the ragged pair path."""

import numpy as np
import pytest

import indexer
from indexer import arrays, launch, testing
from tests.gpu import requires_gpu
from tests.test_cuda_counters_at_rest import on_device, shapes
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]


def test_it_is_on_for_hopper():
    cp = arrays.cupy()
    dev = cp.cuda.Device()
    if int(dev.compute_capability) < 90:
        pytest.skip("programmatic dependent launch needs sm_90")
    assert launch.enabled(dev.id)


def both_ways(monkeypatch, call):
    monkeypatch.setenv("INDEXER_PDL", "0")
    plain = [a.get() for a in call()]
    monkeypatch.setenv("INDEXER_PDL", "1")
    overlapped = [a.get() for a in call()]
    for a, b in zip(plain, overlapped):
        np.testing.assert_array_equal(a, b)
    return overlapped


@pytest.mark.parametrize("precision", ["fast", "exact"])
@pytest.mark.parametrize("select", ["multi", "rows"])
def test_same_bits_as_ordinary_launches(monkeypatch, precision, select):
    from indexer import cuda_ops  # imports CuPy

    ws = indexer.Workspace()
    for p in shapes(np.random.default_rng(81)):
        dev = on_device(p)
        idx, sc = both_ways(monkeypatch, lambda: cuda_ops.score_topk(
            *dev, p.top_k, precision=precision, return_scores=True, workspace=ws, _select=select))
        testing.check_topk(p, idx, sc, tol=testing.TOL_FAST if precision == "fast" else testing.TOL_EXACT)


@pytest.mark.parametrize("counts,entries,top_k", [([2, 2, 2, 2], [3000] * 4, 100), ([300], [500], 16)])
def test_ragged_same_bits_as_ordinary_launches(monkeypatch, counts, entries, top_k):
    cp = arrays.cupy()
    rng = np.random.default_rng(82)
    args = grouped_problem(rng, counts, H=64, D=128, E=64, seq_entries=entries, ratio=4 if len(counts) == 1 else None,
                           top_k=top_k)
    dev = [cp.asarray(a) for a in args]
    idx, sc = both_ways(monkeypatch, lambda: indexer.score_topk_ragged(*dev, top_k, return_scores=True))
    testing.check_topk(as_problem(*args, top_k), idx, sc, tol=testing.TOL_FAST)


def test_graph_replays_match_eager_calls(monkeypatch):
    cp = arrays.cupy()
    monkeypatch.setenv("INDEXER_PDL", "1")
    problems = shapes(np.random.default_rng(83))[:3]
    stream = cp.cuda.Stream(non_blocking=True)
    ws = indexer.Workspace()
    with stream:
        for p in problems:
            dev = on_device(p)
            out = (cp.empty((p.q.shape[0], p.top_k), cp.int32), cp.empty((p.q.shape[0], p.top_k), cp.float32))
            indexer.score_topk(*dev, p.top_k, return_scores=True, validate=False, out=out, workspace=ws)
            eager = [a.get() for a in out]
            stream.begin_capture()
            try:
                indexer.score_topk(*dev, p.top_k, return_scores=True, validate=False, out=out, workspace=ws)
            finally:
                graph = stream.end_capture()
            for a in out:
                a.fill(-3)
            for _ in range(3):
                graph.launch(stream)
            stream.synchronize()
            for a, b in zip(eager, out):
                np.testing.assert_array_equal(a, b.get())
            testing.check_topk(p, eager[0], eager[1], tol=testing.TOL_FAST)
