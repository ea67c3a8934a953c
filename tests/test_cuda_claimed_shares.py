"""The balanced wgmma kernels (one query a tile, and row pairs) let their CTAs claim their
shares of the tiles from two counters (kernels/wgmma_common.cuh: ShareClaims) instead of
taking equal shares: the answers are the equal shares' bit for bit and the reference's,
whatever the wave's CTAs against the rows' tiles (more tiles, fewer, none at all), and the
counters are zero after every call, from a workspace or from the call's own memory."""

import numpy as np
import pytest

import indexer
from indexer import arrays, testing
from tests.gpu import requires_gpu, side_stream
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]


def single(rng, lens, *, D=128, E=64, top_k=64):
    return testing.random_problem(rng, T=len(lens), H=64, D=D, E=E, lens=lens, top_k=top_k)


# per-token rows: tiles past the wave's 396 CTAs, a few tiles, none; a smaller head dim
# with small blocks (several copies a tile)
SINGLE = {
    "more tiles than CTAs": dict(lens=[30_000, 0, 17_000, 129, 26_000, 4_097], top_k=512),
    "fewer tiles than CTAs": dict(lens=[300, 1, 0], top_k=16),
    "no tiles": dict(lens=[0, 0]),
    "D 64, E 16": dict(lens=[9_000, 20_000, 77], D=64, E=16, top_k=100),
    # 200 rows of 6-11 tiles: most claims run on into a next row, whose first tiles' keys the
    # segment before asks of L2 (prefetch_row_start_l2); lengths off the block edges
    "a next row in most claims": dict(lens=[700 + (37 * i) % 700 for i in range(200)], top_k=64),
}
# row pairs of one sequence (multi-token decode), unpaired rows, an empty sequence
PAIRS = {
    "pairs": dict(counts=[2, 2, 2], seq_entries=[30_000, 9_000, 500], top_k=256),
    "unpaired": dict(counts=[1, 2, 1], seq_entries=[700, 12_000, 3], top_k=32),
    "empty sequence": dict(counts=[2, 0, 2], seq_entries=[40_000, 5, 0], top_k=64),
    # three rows a request: the lone rows in a launch of their own (geometry.pairs_split)
    "lone rows apart": dict(counts=[3, 3, 3, 3], seq_entries=[20_000, 600, 9_000, 0], top_k=128),
    # one sequence of an odd count: its last row alone in the pair's own form (not split)
    "a last row alone": dict(counts=[5], seq_entries=[25_000], top_k=64),
}


def counters(ws):  # every pair (the even runs' and the odd ones', then the lone-row launches')
    return np.concatenate([pair.get() for pair in ws.claim_counters()])


def run(args, top_k, ws, cu=None):
    from indexer import cuda_ops  # imports CuPy

    cp = arrays.cupy()
    dev = [cp.asarray(a) for a in args]
    idx, sc = cuda_ops.score_topk(*dev, top_k, precision="fast", return_scores=True, workspace=ws,
                                  _fast_kernel="wgmma", _cu_seqlens=None if cu is None else cp.asarray(cu))
    return idx.get(), sc.get()


def check_claims_against_equal_shares(monkeypatch, problem, args, top_k, cu=None):
    from indexer import cuda_ops  # imports CuPy

    ws = indexer.Workspace()
    idx, sc = run(args, top_k, ws, cu)
    testing.check_topk(problem, idx, sc, tol=testing.TOL_FAST)
    assert not counters(ws).any()
    again = run(args, top_k, ws, cu)  # the counters the first call left
    own = run(args, top_k, None, cu)  # no workspace: the call's own counters
    monkeypatch.setattr(cuda_ops, "_CLAIMED_SHARES", False)
    equal = run(args, top_k, indexer.Workspace(), cu)
    for other in (again, own, equal):
        np.testing.assert_array_equal(other[0], idx)
        assert other[1].tobytes() == sc.tobytes()
    assert not counters(ws).any()


@pytest.mark.parametrize("name", list(SINGLE))
def test_single_query_rows(monkeypatch, name):
    spec = dict(SINGLE[name])
    rng = np.random.default_rng(len(name))
    p = single(rng, **spec)
    check_claims_against_equal_shares(monkeypatch, p, p.arrays(), p.top_k)


@pytest.mark.parametrize("name", list(PAIRS))
def test_row_pairs(monkeypatch, name):
    spec = dict(PAIRS[name])
    top_k = spec.pop("top_k")
    rng = np.random.default_rng(len(name) + 100)
    q, w, k, s, g, table, cu, lens = grouped_problem(rng, spec["counts"], H=64, D=128, E=64,
                                                     seq_entries=spec["seq_entries"], top_k=top_k)
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    check_claims_against_equal_shares(monkeypatch, as_problem(q, w, k, s, g, table, cu, lens, top_k),
                                      (q, w, k, s, g, per_token, lens), top_k, cu)


def test_counters_stay_zero_through_graph_replays():
    # a prepared call given out= replays its launches from a CUDA graph from its second call
    # with the same pointers on: each replay's last CTA sets the counters back to zero, so
    # every replay claims from zero
    cp = arrays.cupy()
    rng = np.random.default_rng(5)
    p = single(rng, lens=[20_000, 7_000, 31_000], top_k=128)
    dev = [cp.asarray(a) for a in p.arrays()]
    ws = indexer.Workspace()
    step = indexer.prepare(*dev, p.top_k, workspace=ws, validate=False)
    out = cp.full((3, 128), -7, dtype=cp.int32)
    step(*dev, out=out)
    first = out.get()
    testing.check_topk(p, first, tol=testing.TOL_FAST)
    for _ in range(4):
        out.fill(-7)
        step(*dev, out=out)
        np.testing.assert_array_equal(out.get(), first)
        assert not counters(ws).any()


def test_runs_of_rows_claim_from_alternate_pairs():
    # a small budget cuts the rows into runs; a scoring kernel lets the next kernel be placed
    # before its last CTAs clear their counters, and in a scoring-only call the next kernel is
    # the next run's scoring kernel, which claims from the other pair: after scoring-only
    # calls of several runs both pairs are zero, and the calls after them answer as before
    from indexer import cuda_ops  # imports CuPy

    cp = arrays.cupy()
    rng = np.random.default_rng(7)
    p = single(rng, lens=[30_000, 9_000, 27_000, 0, 31_000, 18_000, 12_345], top_k=256)
    dev = [cp.asarray(a) for a in p.arrays()]
    ws = indexer.Workspace()
    kw = dict(precision="fast", return_scores=True, workspace=ws, _fast_kernel="wgmma")
    budget = 2 * 30_100 * 4 + 4096  # about two rows a run: four runs
    idx, sc = (a.get() for a in cuda_ops.score_topk(*dev, p.top_k, workspace_budget=budget, **kw))
    testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)
    one_run = [a.get() for a in cuda_ops.score_topk(*dev, p.top_k, **kw)]
    np.testing.assert_array_equal(one_run[0], idx)
    assert one_run[1].tobytes() == sc.tobytes()
    for _ in range(5):
        cuda_ops.score_topk(*dev, p.top_k, workspace_budget=budget, _score_only=True, **kw)
    cp.cuda.get_current_stream().synchronize()
    assert not counters(ws).any()
    again = [a.get() for a in cuda_ops.score_topk(*dev, p.top_k, workspace_budget=budget, **kw)]
    np.testing.assert_array_equal(again[0], idx)
    assert again[1].tobytes() == sc.tobytes()
    assert not counters(ws).any()


def test_split_pair_calls_in_runs_leave_every_counter_zero():
    # lone rows in launches of their own (three rows a request), the rows cut into runs by a
    # small budget: each run's shared-pair and lone-row launches claim from their own pairs,
    # alternating by run; after whole and scoring-only calls every counter is zero and the
    # answers are those of one run
    from indexer import cuda_ops  # imports CuPy

    cp = arrays.cupy()
    rng = np.random.default_rng(8)
    q, w, k, s, g, table, cu, lens = grouped_problem(rng, [3] * 6, H=64, D=128, E=64,
                                                     seq_entries=[9_000, 20_000, 1, 7_000, 15_000, 300], top_k=96)
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    ws = indexer.Workspace()
    kw = dict(precision="fast", return_scores=True, workspace=ws, _fast_kernel="pairs", _cu_seqlens=cp.asarray(cu))
    # two rows a run (each row's scores, query image, histogram and candidate buffer): nine
    # runs, so that sequences of three rows cross runs and the runs alternate between units
    # that all share and units split
    budget = 6 * 20_100 * 4 + 4096
    idx, sc = (a.get() for a in cuda_ops.score_topk(*dev, 96, workspace_budget=budget, **kw))
    testing.check_topk(as_problem(q, w, k, s, g, table, cu, lens, 96), idx, sc, tol=testing.TOL_FAST)
    one_run = [a.get() for a in cuda_ops.score_topk(*dev, 96, **kw)]
    np.testing.assert_array_equal(one_run[0], idx)
    assert one_run[1].tobytes() == sc.tobytes()
    for _ in range(5):
        cuda_ops.score_topk(*dev, 96, workspace_budget=budget, _score_only=True, **kw)
    cp.cuda.get_current_stream().synchronize()
    assert not counters(ws).any()


def test_split_pair_calls_keep_every_counter_zero_through_graph_replays():
    # a prepared grouped call of three rows a request replays its graph from its second call:
    # the shared pairs' launch and the lone rows' (placed under the first's end: programmatic
    # dependent launch in graphs) each claim from their own pair and leave it zero
    cp = arrays.cupy()
    rng = np.random.default_rng(9)
    q, w, k, s, g, table, cu, lens = grouped_problem(rng, [3, 3, 3, 3], H=64, D=128, E=64,
                                                     seq_entries=[21_000, 5_000, 30_000, 700], top_k=128)
    dev = [cp.asarray(a) for a in (q, w, k, s, g, table, lens)]
    cu_dev = cp.asarray(cu)
    ws = indexer.Workspace()
    step = indexer.prepare(*dev, 128, workspace=ws, validate=False, cu_seqlens_q=cu_dev)
    out = cp.full((12, 128), -7, dtype=cp.int32)
    step(*dev, out=out, cu_seqlens_q=cu_dev)
    first = out.get()
    testing.check_topk(as_problem(q, w, k, s, g, table, cu, lens, 128), first, tol=testing.TOL_FAST)
    for _ in range(4):
        out.fill(-7)
        step(*dev, out=out, cu_seqlens_q=cu_dev)
        np.testing.assert_array_equal(out.get(), first)
        assert not counters(ws).any()


def test_reserve_allocates_the_counters():
    ws = indexer.Workspace()
    ws.reserve(1 << 20)
    assert not counters(ws).any()


def test_a_capture_before_the_counters_exist_takes_equal_shares():
    # a workspace sized by a call of a kernel that claims nothing (here: its counters
    # dropped) holds none when a capture starts: the captured call allocates nothing and
    # gives its CTAs equal shares
    from indexer import cuda_ops  # imports CuPy

    cp = arrays.cupy()
    rng = np.random.default_rng(6)
    p = single(rng, lens=[12_000, 3_000], top_k=64)
    dev = [cp.asarray(a) for a in p.arrays()]
    ws = indexer.Workspace()
    kw = dict(precision="fast", workspace=ws, validate=False, _fast_kernel="wgmma")
    want = cuda_ops.score_topk(*dev, p.top_k, **kw).get()  # compiled and sized outside the capture
    key = (int(cp.cuda.runtime.getDevice()), "claims")
    del ws._buffers[key]
    out = cp.full((2, 64), -7, dtype=cp.int32)
    stream = side_stream()

    def no_allocation(nbytes):
        raise AssertionError(f"the call allocated {nbytes} bytes from CuPy")

    with stream, cp.cuda.using_allocator(no_allocation):
        stream.begin_capture()
        try:
            cuda_ops.score_topk(*dev, p.top_k, out=out, **kw)
        finally:
            graph = stream.end_capture()
    assert key not in ws._buffers
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.get(), want)
