"""The select's histograms on a Workspace are zero at rest: every complete call leaves them
zero (the candidate counts are cleared by each call's scoring kernel instead), so the next
call launches no fill; a call that stops between launches clears them on its stream before
it raises (and marks them dirty, so the next call fills them too); a scoring-only call
counts elsewhere. Checked on every select route (all-pairs rank, binned rank, the one-CTA
sort, the streamed one-CTA select, the overflow fallback), across call shapes, in CUDA
graphs, and after an interrupted call."""

import numpy as np
import pytest

import indexer
from indexer import arrays, geometry, testing
from tests.gpu import pair_of_problems, requires_gpu, side_stream

pytestmark = [requires_gpu, pytest.mark.gpu]


def on_device(p):
    cp = arrays.cupy()
    return [cp.asarray(a) for a in p.arrays()]


def shapes(rng):
    """One problem per select route of the multi-CTA select."""
    batch1 = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=[30_000], top_k=1024)  # all pairs
    # few rows past rows x k = 2,048 (geometry.rank_all_pairs): ranked in fine key bins
    few = testing.random_problem(rng, T=6, H=64, D=128, E=64, lens=[9000, 0, 5000, 4097, 7000, 100], top_k=400)
    overflow = testing.zero_plateau(testing.random_problem(rng, T=5, H=8, D=64, E=64,
                                                           lens=[20_000, 9_000, 6_000, 3_000, 300], top_k=500),
                                    rng)  # fallback, sort, ranks of ties (in fine key bins)
    assert not geometry.rank_all_pairs(6, 400) and not geometry.rank_all_pairs(5, 500)
    many = testing.random_problem(rng, T=200, H=16, D=64, E=64, lens=rng.integers(4097, 6000, size=200),
                                  top_k=2048)  # 200 rows x 16 rank CTAs: one CTA a row sorts instead
    streamed = testing.random_problem(rng, T=140, H=16, D=64, E=64, lens=rng.integers(0, 9000, size=140),
                                      top_k=1024)  # an SM's worth of rows: one CTA a row streams and ranks
    return [batch1, few, overflow, many, streamed]


def zeroed_part(ws):
    cp = arrays.cupy()
    return ws._buffers[(int(cp.cuda.runtime.getDevice()), "zeroed")]


def call_interrupted_before(monkeypatch, cuda_ops, kernel, call):
    """Runs ``call()`` with the launch of ``kernel`` through ``cuda_ops.after_previous``
    raising RuntimeError("interrupted") (the kernels before it launched, it and those after
    it not), checks that the call raised it, and puts the launcher back."""
    real = cuda_ops.after_previous

    def broken(launched, *args, **kwargs):
        if launched is kernel:
            raise RuntimeError("interrupted")
        return real(launched, *args, **kwargs)

    monkeypatch.setattr(cuda_ops, "after_previous", broken)
    try:
        with pytest.raises(RuntimeError, match="interrupted"):
            call()
    finally:
        monkeypatch.setattr(cuda_ops, "after_previous", real)


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_histograms_are_zero_after_every_call_of_every_route_and_shape(precision):
    from indexer import cuda_ops  # imports CuPy

    cp = arrays.cupy()
    rng = np.random.default_rng(71)
    problems = shapes(rng)
    ws = indexer.Workspace()
    for p in problems + problems[::-1]:
        idx, sc = cuda_ops.score_topk(*on_device(p), p.top_k, precision=precision, return_scores=True,
                                      workspace=ws, _select="multi")
        testing.check_topk(p, idx.get(), sc.get(), tol=testing.TOL_FAST if precision == "fast" else testing.TOL_EXACT)
        assert int(cp.count_nonzero(zeroed_part(ws))) == 0
        assert ws.zeroed(8)[1]


def test_a_scoring_only_call_leaves_them_zero():
    from indexer import cuda_ops  # imports CuPy

    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(72), T=2, H=64, D=128, E=64, lens=[20_000, 7000], top_k=512)
    dev = on_device(p)
    ws = indexer.Workspace()
    cuda_ops.score_topk(*dev, p.top_k, workspace=ws, _select="multi")
    cuda_ops.score_topk(*dev, p.top_k, workspace=ws, _select="multi", _score_only=True)  # counts elsewhere
    assert ws.zeroed(8)[1]
    assert int(cp.count_nonzero(zeroed_part(ws))) == 0
    idx, sc = cuda_ops.score_topk(*dev, p.top_k, return_scores=True, workspace=ws, _select="multi")
    testing.check_topk(p, idx.get(), sc.get(), tol=testing.TOL_FAST)
    assert ws.zeroed(8)[1] and int(cp.count_nonzero(zeroed_part(ws))) == 0


def test_a_call_interrupted_between_launches_clears_what_it_counted(monkeypatch):
    """The interrupted call's counts are cleared on its stream before it raises, so a graph
    captured earlier (with no fill of its own) still replays right after it."""
    from indexer import cuda_ops  # imports CuPy

    cp = arrays.cupy()
    p, p2 = pair_of_problems(73, T=1, H=64, D=128, E=64, lens=[30_000], top_k=1024)
    dev = on_device(p)
    out = (cp.empty((1, p.top_k), cp.int32), cp.empty((1, p.top_k), cp.float32))
    ws = indexer.Workspace()
    stream = side_stream()
    with stream:
        cuda_ops.score_topk(*dev, p.top_k, return_scores=True, out=out, workspace=ws)  # compiles, sizes
        stream.synchronize()
        stream.begin_capture()
        try:
            cuda_ops.score_topk(*dev, p.top_k, return_scores=True, validate=False, out=out, workspace=ws)
        finally:
            graph = stream.end_capture()
        rank = cuda_ops._kernel("select_fast.cu", "topk_rank_kernel<256, true>", cp.cuda.Device().id)
        # interrupted after the scoring and filter kernels have counted
        call_interrupted_before(monkeypatch, cuda_ops, rank, lambda: cuda_ops.score_topk(*dev, p.top_k, workspace=ws))
        stream.synchronize()
        assert int(cp.count_nonzero(zeroed_part(ws))) == 0
        assert not ws.zeroed(8)[1]  # still marked dirty: the next eager call fills them anyway
        for d, x in zip(dev, p2.arrays()):
            d.set(x)
        graph.launch(stream)
        stream.synchronize()
        testing.check_topk(p2, out[0].get(), out[1].get(), tol=testing.TOL_FAST)
        idx, sc = cuda_ops.score_topk(*dev, p2.top_k, return_scores=True, workspace=ws)
        testing.check_topk(p2, idx.get(), sc.get(), tol=testing.TOL_FAST)
        assert ws.zeroed(8)[1] and int(cp.count_nonzero(zeroed_part(ws))) == 0


def test_graphs_of_two_shapes_on_one_workspace_replay_in_any_order():
    cp = arrays.cupy()
    rng = np.random.default_rng(74)
    pa, pa2 = pair_of_problems(75, T=1, H=64, D=128, E=64, lens=[30_000], top_k=1024)
    pb, pb2 = pair_of_problems(76, T=6, H=64, D=128, E=64, lens=[9000, 0, 5000, 4097, 7000, 100], top_k=400)  # binned rank
    ws = indexer.Workspace()
    stream = side_stream()
    graphs = {}
    with stream:
        calls = {}
        for name, (p, p2) in {"a": (pa, pa2), "b": (pb, pb2)}.items():
            dev, out = on_device(p), (cp.empty((p.q.shape[0], p.top_k), cp.int32),
                                      cp.empty((p.q.shape[0], p.top_k), cp.float32))
            calls[name] = (dev, out, p, p2)
            # warm-up of both shapes before either capture: compiles, and sizes the
            # workspace for both (a capture before the other shape grew it would be stale)
            indexer.score_topk(*dev, p.top_k, return_scores=True, validate=False, out=out, workspace=ws)
        stream.synchronize()
        for name, (dev, out, p, p2) in calls.items():
            stream.begin_capture()
            try:
                indexer.score_topk(*dev, p.top_k, return_scores=True, validate=False, out=out, workspace=ws)
            finally:
                graphs[name] = (stream.end_capture(), dev, out, p, p2)
        for name in "abbaab":
            graph, dev, out, p, p2 = graphs[name]
            use = p2 if rng.random() < 0.5 else p
            for d, x in zip(dev, use.arrays()):
                d.set(x)  # pageable host copies: synchronous, before the replay
            graph.launch(stream)
            stream.synchronize()
            testing.check_topk(use, out[0].get(), out[1].get(), tol=testing.TOL_FAST)
            assert int(cp.count_nonzero(zeroed_part(ws))) == 0


def test_a_capture_right_after_reserve_keeps_its_histograms_in_scratch():
    """No call before the capture: the at-rest part would have to grow mid-capture, so the
    call keeps its histograms in the reserved scratch (a fill in the graph) instead."""
    cp = arrays.cupy()
    p, p2 = pair_of_problems(77, T=1, H=64, D=128, E=64, lens=[30_000], top_k=1024)
    dev = on_device(p)
    out = (cp.empty((1, p.top_k), cp.int32), cp.empty((1, p.top_k), cp.float32))
    indexer.score_topk(*dev, p.top_k, return_scores=True, out=out, workspace=indexer.Workspace())  # compiles
    ws = indexer.Workspace()
    ws.reserve(64 << 20)
    stream = side_stream()
    with stream:
        stream.begin_capture()
        try:
            indexer.score_topk(*dev, p.top_k, return_scores=True, validate=False, out=out, workspace=ws)
        finally:
            graph = stream.end_capture()
        assert (cp.cuda.runtime.getDevice(), "zeroed") not in ws._buffers
        for use in (p2, p, p2):
            for d, x in zip(dev, use.arrays()):
                d.set(x)
            graph.launch(stream)
            stream.synchronize()
            testing.check_topk(use, out[0].get(), out[1].get(), tol=testing.TOL_FAST)


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_runs_of_one_row_reuse_the_histograms_each_run_leaves_zero(precision):
    """workspace_budget=1: one row a run, so every run after the first counts into the
    histogram rows the run before cleared; the bits match one run of all rows."""
    from indexer import cuda_ops  # imports CuPy

    cp = arrays.cupy()
    for p in shapes(np.random.default_rng(78))[1:3]:  # several rows: the few-rows and plateau shapes
        dev = on_device(p)
        ws = indexer.Workspace()
        whole = cuda_ops.score_topk(*dev, p.top_k, precision=precision, return_scores=True, _select="multi")
        runs = cuda_ops.score_topk(*dev, p.top_k, precision=precision, return_scores=True, _select="multi",
                                   workspace=ws, workspace_budget=1)
        np.testing.assert_array_equal(whole[0].get(), runs[0].get())
        assert whole[1].get().tobytes() == runs[1].get().tobytes()
        testing.check_topk(p, runs[0].get(), runs[1].get(),
                           tol=testing.TOL_FAST if precision == "fast" else testing.TOL_EXACT)
        assert int(cp.count_nonzero(zeroed_part(ws))) == 0
