"""The select kernels (and the single-query wgmma scoring after its query staging) captured
into CUDA graphs with programmatic dependent launch (indexer/launch.py) give the same bits
as ordinary launches, on every select route
(all-pairs rank, binned rank, the one-CTA sort, the overflow fallback, the short-row
select, the exact path's histogram), on the ragged pair path and on the dense kernel (under its
key image's kernel, the select under its tail); eager calls launch the
ordinary way."""

import numpy as np
import pytest

import indexer
from indexer import arrays, launch, testing
from tests.gpu import pairs_at_any_work, requires_gpu, side_stream
from tests.test_cuda_counters_at_rest import on_device, shapes
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]


def test_it_is_on_for_hopper():
    cp = arrays.cupy()
    dev = cp.cuda.Device()
    if int(dev.compute_capability) < 90:
        pytest.skip("programmatic dependent launch needs sm_90")
    assert launch.enabled(dev.id)


def replayed(call, T, k):
    """(indices, scores) of ``call(out, ws)`` captured into a CUDA graph and replayed twice
    into out= buffers first filled with junk."""
    cp = arrays.cupy()
    out = (cp.empty((T, k), cp.int32), cp.empty((T, k), cp.float32))
    ws = indexer.Workspace()
    stream = side_stream()
    with stream:
        call(out, ws)  # compiles, sizes the workspace
        stream.synchronize()
        stream.begin_capture()
        try:
            call(out, ws)
        finally:
            graph = stream.end_capture()
        for a in out:
            a.fill(-3)
        graph.launch(stream)
        graph.launch(stream)
        stream.synchronize()
    return [a.get() for a in out]


def both_ways(monkeypatch, call, T, k):
    monkeypatch.setenv("INDEXER_PDL", "0")
    plain = replayed(call, T, k)
    monkeypatch.setenv("INDEXER_PDL", "1")
    overlapped = replayed(call, T, k)
    for a, b in zip(plain, overlapped):
        np.testing.assert_array_equal(a, b)
    return overlapped


@pytest.mark.parametrize("precision", ["fast", "exact"])
@pytest.mark.parametrize("select", ["multi", "rows"])
def test_same_bits_as_ordinary_launches(monkeypatch, precision, select):
    from indexer import cuda_ops  # imports CuPy

    for p in shapes(np.random.default_rng(81)):
        dev = on_device(p)
        idx, sc = both_ways(monkeypatch, lambda out, ws: cuda_ops.score_topk(
            *dev, p.top_k, precision=precision, return_scores=True, validate=False, out=out, workspace=ws,
            _select=select), p.q.shape[0], p.top_k)
        testing.check_topk(p, idx, sc, tol=testing.TOL_FAST if precision == "fast" else testing.TOL_EXACT)


@pytest.mark.parametrize("counts,entries,top_k", [
    ([2, 2, 2, 2], [3000] * 4, 100), ([300], [500], 16),
    ([3, 3, 3, 3], [3000, 900, 5000, 64], 100),  # split: the lone rows' launch under the shared pairs' end
])
def test_ragged_same_bits_as_ordinary_launches(monkeypatch, counts, entries, top_k):
    cp = arrays.cupy()
    rng = np.random.default_rng(82)
    args = grouped_problem(rng, counts, H=64, D=128, E=64, seq_entries=entries, ratio=4 if len(counts) == 1 else None,
                           top_k=top_k)
    dev = [cp.asarray(a) for a in args]
    with pairs_at_any_work():  # the pair kernel, as on calls of more work
        idx, sc = both_ways(monkeypatch, lambda out, ws: indexer.score_topk_ragged(
            *dev, top_k, return_scores=True, validate=False, out=out, workspace=ws), sum(counts), top_k)
    testing.check_topk(as_problem(*args, top_k), idx, sc, tol=testing.TOL_FAST)


@pytest.mark.parametrize("empty", [False, True])
def test_dense_kernel_same_bits_as_ordinary_launches(monkeypatch, empty):
    # the dense kernel starts under its key image's kernel and lets the select start under
    # its own tail (kernels/score_dense.cu): graph replays with and without the overlap
    # agree; with every row empty, every CTA of the dense kernel leaves early (after its wait)
    from indexer import cuda_ops, geometry  # imports CuPy

    cp = arrays.cupy()
    if not geometry.dense_supported(64, 128, cuda_ops.device_facts(cp.cuda.Device().id)):
        pytest.skip("the dense kernel is a Hopper wgmma kernel")
    rng = np.random.default_rng(85)
    args = grouped_problem(rng, [700], H=64, D=128, E=64, seq_entries=[1500], ratio=2, top_k=256)
    if empty:
        args[7][:] = 0
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    cu_dev = cp.asarray(cu)
    idx, sc = both_ways(monkeypatch, lambda out, ws: cuda_ops.score_topk(
        *dev, 256, return_scores=True, validate=False, out=out, workspace=ws, _cu_seqlens=cu_dev,
        _fast_kernel="dense"), 700, 256)
    testing.check_topk(as_problem(*args, 256), idx, sc, tol=testing.TOL_FAST)


def test_eager_calls_launch_the_ordinary_way(monkeypatch):
    from indexer import cuda_ops  # imports CuPy

    p = shapes(np.random.default_rng(84))[0]
    dev = on_device(p)
    monkeypatch.setenv("INDEXER_PDL", "1")
    cuda_ops.score_topk(*dev, p.top_k)  # compiles
    used = []
    monkeypatch.setattr(launch, "_driver", lambda: (lambda *args: used.append(args) or 0, None))
    idx, sc = cuda_ops.score_topk(*dev, p.top_k, return_scores=True)
    assert not used  # no cuLaunchKernelEx: CuPy launched every kernel
    testing.check_topk(p, idx.get(), sc.get(), tol=testing.TOL_FAST)
