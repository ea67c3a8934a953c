"""out=, workspace= and stream= on the GPU with CuPy arrays: results written into the caller's
arrays, a workspace reused across calls and replayed from CUDA graphs without touching
CuPy's pool, and the call ordered on the stream it is given."""


import numpy as np
import pytest

import indexer
from indexer import arrays, testing, workspace
from tests.gpu import check_threads, in_one_buffer, pair_of_problems, requires_gpu, side_stream, warmed_stream_case

pytestmark = [requires_gpu, pytest.mark.gpu]

TOL = {"exact": testing.TOL_EXACT, "fast": testing.TOL_FAST}
PRECISIONS = pytest.mark.parametrize("precision", ["exact", "fast"])


def on_device(p):
    cp = arrays.cupy()
    return [cp.asarray(a) for a in p.arrays()]


def empty_out(T, k, scores=True):
    cp = arrays.cupy()
    idx = cp.full((T, k), -7, dtype=cp.int32)
    return (idx, cp.full((T, k), 7.0, dtype=cp.float32)) if scores else idx


def no_allocation(nbytes):
    raise AssertionError(f"the call allocated {nbytes} bytes from CuPy")


def refill(dev, p):
    """Overwrite the device arrays in place with the arrays of p (a copy on the current stream)."""
    cp = arrays.cupy()
    for d, h in zip(dev, p.arrays()):
        cp.copyto(d, cp.asarray(h))


# ----------------------------------------------------------------------------- out=


@PRECISIONS
def test_out_cupy_is_returned_and_equals_a_fresh_result(precision):
    rng = np.random.default_rng(30)
    p = testing.random_problem(rng, T=5, H=16, D=64, E=32, L=4, top_k=40)
    dev = on_device(p)
    out = empty_out(5, 40)
    res = indexer.score_topk(*dev, p.top_k, precision=precision, return_scores=True, out=out)
    assert res is out
    fresh = indexer.score_topk(*dev, p.top_k, precision=precision, return_scores=True)
    np.testing.assert_array_equal(out[0].get(), fresh[0].get())
    assert out[1].get().tobytes() == fresh[1].get().tobytes()
    testing.check_topk(p, out[0].get(), out[1].get(), tol=TOL[precision])
    only = empty_out(5, 40, scores=False)
    assert indexer.score_topk(*dev, p.top_k, precision=precision, physical=True, out=only) is only
    np.testing.assert_array_equal(only.get(), indexer.score_topk(*dev, p.top_k, precision=precision,
                                                                  physical=True).get())


def test_out_with_workspace_allocates_nothing():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(31), T=6, H=64, D=128, E=64, lens=5000, top_k=512)
    dev = on_device(p)
    ws, out = indexer.Workspace(), empty_out(6, 512)
    for precision in ("fast", "exact"):  # warm-up: compiles, sizes the workspace for both paths
        indexer.score_topk(*dev, p.top_k, precision=precision, return_scores=True, validate=False, out=out,
                           workspace=ws)
    with cp.cuda.using_allocator(no_allocation):
        for precision in ("fast", "exact"):
            indexer.score_topk(*dev, p.top_k, precision=precision, return_scores=True, validate=False, out=out,
                               workspace=ws)
    testing.check_topk(p, out[0].get(), out[1].get(), tol=testing.TOL_EXACT)


def test_numpy_inputs_on_the_gpu_fill_numpy_out():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(32), T=3, H=8, D=64, E=16, L=3, top_k=12)
    out = (np.empty((3, 12), dtype=np.int32), np.empty((3, 12), dtype=np.float32))
    assert indexer.score_topk(*p.args(), backend="cuda", return_scores=True, out=out) is out
    fresh = indexer.score_topk(*p.args(), backend="cuda", return_scores=True)
    np.testing.assert_array_equal(out[0], fresh[0])
    np.testing.assert_array_equal(out[1], fresh[1])
    with pytest.raises(TypeError, match="^out: expected a NumPy array"):
        indexer.score_topk(*p.args(), backend="cuda", out=cp.empty((3, 12), dtype=cp.int32))


def test_bad_device_out_names_the_argument():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(33), T=3, H=8, D=64, E=16, L=3, top_k=12)
    dev = on_device(p)
    with pytest.raises(TypeError, match="^out: expected a CuPy array like q, got ndarray"):
        indexer.score_topk(*dev, p.top_k, out=np.empty((3, 12), dtype=np.int32))
    with pytest.raises(ValueError, match=r"^out: expected int32 of shape \(T, top_k\) = \(3, 12\)"):
        indexer.score_topk(*dev, p.top_k, out=cp.empty((3, 13), dtype=cp.int32))
    with pytest.raises(ValueError, match="^out: expected a C-contiguous"):
        indexer.score_topk(*dev, p.top_k, out=cp.empty((12, 3), dtype=cp.int32).T)
    with pytest.raises(TypeError, match="^out\\[1\\]: expected float32"):
        indexer.score_topk(*dev, p.top_k, return_scores=True,
                           out=(cp.empty((3, 12), dtype=cp.int32), cp.empty((3, 12), dtype=cp.float64)))


NAMES = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens")


@pytest.mark.parametrize("which", [0, 2, 3, 6])
@pytest.mark.parametrize("host", [False, True], ids=["cupy", "numpy"])
def test_out_overlapping_an_input_is_refused_and_the_input_kept(which, host):
    cp = arrays.cupy()
    xp = np if host else cp
    p = testing.random_problem(np.random.default_rng(34), T=3, H=64, D=128, E=64, L=40, lens=[2000, 5, 700], top_k=64)
    args = list(p.arrays()) if host else on_device(p)
    args[which], out = in_one_buffer(args[which], 3, 64, overlap=True, xp=xp)
    kept = args[which].copy()
    with pytest.raises(ValueError, match=f"^out: expected memory of its own, got an array overlapping {NAMES[which]}$"):
        indexer.score_topk(*args, p.top_k, backend="cuda", out=out)
    assert (args[which] == kept).all()
    args[which], out = in_one_buffer(args[which], 3, 64, overlap=False, xp=xp)
    assert indexer.score_topk(*args, p.top_k, backend="cuda", out=out) is out
    testing.check_topk(p, arrays.to_numpy(out), tol=testing.TOL_FAST)


def test_ragged_out_overlapping_its_offsets_or_its_pair_is_refused():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(35), T=3, H=64, D=128, E=64, L=40, lens=[2000, 1990, 700],
                               top_k=64)
    dev = on_device(p)
    table = cp.tile(cp.arange(40, dtype=cp.int32), (2, 1))
    cu, out = in_one_buffer(cp.array([0, 2, 3], dtype=cp.int32), 3, 64, overlap=True, xp=cp)
    args = (*dev[:5], table, cu, dev[6], p.top_k)
    with pytest.raises(ValueError, match="^out: expected memory of its own, got an array overlapping cu_seqlens_q$"):
        indexer.score_topk_ragged(*args, out=out)
    assert cu.tolist() == [0, 2, 3]
    raw = cp.empty(3 * 64, dtype=cp.int32)
    with pytest.raises(ValueError, match="^out\\[1\\]: expected memory of its own, got an array overlapping out\\[0\\]$"):
        indexer.score_topk_ragged(*args, return_scores=True, out=(raw.reshape(3, 64), raw.view(cp.float32).reshape(3, 64)))


# ----------------------------------------------------------------------------- workspace=


def test_workspace_is_reused_and_gives_the_same_results():
    p = testing.random_problem(np.random.default_rng(34), T=2, H=16, D=64, E=32, lens=1000, top_k=64)
    dev = on_device(p)
    ws = indexer.Workspace()
    first = indexer.score_topk(*dev, p.top_k, return_scores=True, workspace=ws)
    n = ws.nbytes
    assert n > 0
    second = indexer.score_topk(*dev, p.top_k, return_scores=True, workspace=ws)
    assert ws.nbytes == n  # same shapes: no growth
    plain = indexer.score_topk(*dev, p.top_k, return_scores=True)
    for got in (first, second):
        np.testing.assert_array_equal(got[0].get(), plain[0].get())
        assert got[1].get().tobytes() == plain[1].get().tobytes()
    # a larger call grows it; a smaller one afterwards does not shrink it
    big = testing.random_problem(np.random.default_rng(35), T=8, H=64, D=128, E=64, lens=20_000, top_k=512)
    got = indexer.score_topk(*on_device(big), big.top_k, return_scores=True, workspace=ws)
    testing.check_topk(big, got[0].get(), got[1].get(), tol=testing.TOL_FAST)
    grown = ws.nbytes
    assert grown > n
    indexer.score_topk(*dev, p.top_k, workspace=ws)
    assert ws.nbytes == grown
    assert f"devices=[{arrays.cupy().cuda.runtime.getDevice()}]" in repr(ws)


def test_workspace_reserve():
    cp = arrays.cupy()
    ws = indexer.Workspace()
    ws.reserve(3 << 20)
    held = (3 << 20) + workspace._CLAIMS_BYTES  # and the scoring kernels' claim counters
    assert ws.nbytes == held
    ws.reserve(1 << 20)
    assert ws.nbytes == held
    ws.reserve(5, device=cp.cuda.runtime.getDevice())
    assert ws.nbytes == held
    with pytest.raises(ValueError, match="^device: .* CuPy sees"):
        ws.reserve(5, device=cp.cuda.runtime.getDeviceCount())


def test_growing_while_capturing_is_refused():
    p = testing.random_problem(np.random.default_rng(36), T=2, H=16, D=64, E=32, lens=500, top_k=32)
    dev = on_device(p)
    out = empty_out(2, 32, scores=False)
    indexer.score_topk(*dev, p.top_k, validate=False, out=out)  # kernels compiled outside the capture
    ws = indexer.Workspace()
    stream = side_stream()
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(RuntimeError, match="cannot grow while the stream is capturing.*before the capture"):
                indexer.score_topk(*dev, p.top_k, validate=False, out=out, workspace=ws)
        finally:
            stream.end_capture()
    assert ws.nbytes == 0


# ----------------------------------------------------------------------------- CUDA graphs (CuPy)


@PRECISIONS
def test_cupy_graph_with_workspace_replays_new_inputs_and_leaves_the_pool_alone(precision):
    cp = arrays.cupy()
    p, p2 = pair_of_problems(37, T=4, H=64, D=128, E=64, lens=3000, top_k=256)
    dev = on_device(p)
    ws, out = indexer.Workspace(), empty_out(4, 256)
    kw = dict(precision=precision, return_scores=True, validate=False, out=out, workspace=ws)
    stream = side_stream()
    with stream:
        indexer.score_topk(*dev, p.top_k, **kw)  # warm-up: compiles, sizes the workspace
        stream.synchronize()
        n = ws.nbytes
        stream.begin_capture()
        try:
            with cp.cuda.using_allocator(no_allocation):
                res = indexer.score_topk(*dev, p.top_k, **kw)
        finally:
            graph = stream.end_capture()
        assert res is out and ws.nbytes == n
        # pool memory handed out after the capture: a replay must never write into it
        junk = [cp.full(1 << 20, 123, dtype=cp.uint8) for _ in range(16)]
        refill(dev, p2)
        graph.launch(stream)
        stream.synchronize()
    assert all(int(cp.count_nonzero(j != 123)) == 0 for j in junk)
    eager = indexer.score_topk(*on_device(p2), p2.top_k, precision=precision, return_scores=True)
    np.testing.assert_array_equal(out[0].get(), eager[0].get())
    assert out[1].get().tobytes() == eager[1].get().tobytes()
    testing.check_topk(p2, out[0].get(), out[1].get(), tol=TOL[precision])


def test_cupy_graph_with_rows_that_see_nothing():
    kw = dict(T=4, H=16, D=64, E=64, L=8, top_k=100)
    p = testing.random_problem(np.random.default_rng(38), lens=[0, 500, 0, 64], **kw)
    p2 = testing.random_problem(np.random.default_rng(39), lens=[300, 0, 0, 1], **kw)
    dev = on_device(p)
    ws, out = indexer.Workspace(), empty_out(4, 100)
    call = dict(return_scores=True, validate=False, out=out, workspace=ws)
    stream = side_stream()
    with stream:
        indexer.score_topk(*dev, p.top_k, **call)
        stream.synchronize()
        testing.check_topk(p, out[0].get(), out[1].get(), tol=testing.TOL_FAST)
        stream.begin_capture()
        try:
            indexer.score_topk(*dev, p.top_k, **call)
        finally:
            graph = stream.end_capture()
        refill(dev, p2)
        graph.launch(stream)
        stream.synchronize()
    idx, sc = out[0].get(), out[1].get()
    assert np.all(idx[1:3] == -1) and np.all(np.isneginf(sc[1:3]))
    testing.check_topk(p2, idx, sc, tol=testing.TOL_FAST)
    eager = indexer.score_topk(*on_device(p2), p2.top_k, return_scores=True)
    np.testing.assert_array_equal(idx, eager[0].get())


def test_ragged_graph_with_workspace_allocates_nothing():
    cp = arrays.cupy()
    rng = np.random.default_rng(40)
    P, E, L, H, D, T = 8, 16, 4, 16, 64, 5
    base = testing.random_problem(rng, T=1, H=H, D=D, E=E, lens=P * E, L=P, P=P, top_k=24)
    table = rng.permutation(P).astype(np.int32).reshape(2, L)

    def inputs(seed, cu):
        r = np.random.default_rng(seed)
        q = r.standard_normal((T, H, D)).astype(np.float32)
        w = r.standard_normal((T, H)).astype(np.float32)
        lens = r.integers(0, L * E + 1, size=T).astype(np.int32)
        return [cp.asarray(a) for a in (q, w, base.keys_fp4, base.key_scale, base.key_gscale, table,
                                         np.array(cu, dtype=np.int32), lens)]

    dev = inputs(1, [0, 3, 5])
    new = inputs(2, [0, 1, 5])
    ws, out = indexer.Workspace(), empty_out(T, 24)
    kw = dict(return_scores=True, validate=False, out=out, workspace=ws)
    stream = side_stream()
    with stream:
        indexer.score_topk_ragged(*dev, 24, **kw)
        stream.synchronize()
        n = ws.nbytes
        stream.begin_capture()
        try:
            with cp.cuda.using_allocator(no_allocation):
                indexer.score_topk_ragged(*dev, 24, **kw)
        finally:
            graph = stream.end_capture()
        for d, x in zip(dev, new):
            cp.copyto(d, x)
        graph.launch(stream)
        stream.synchronize()
    assert ws.nbytes == n
    eager = indexer.score_topk_ragged(*new, 24, return_scores=True)
    np.testing.assert_array_equal(out[0].get(), eager[0].get())
    assert out[1].get().tobytes() == eager[1].get().tobytes()
    # and the eager call equals the NumPy reference's selection contract
    host = [x.get() for x in new]
    per_token = host[5][np.array([0, 1, 1, 1, 1])]
    problem = testing.Problem(host[0], host[1], host[2], host[3], host[4], per_token, host[7], 24)
    testing.check_topk(problem, out[0].get(), out[1].get(), tol=testing.TOL_FAST)


# ----------------------------------------------------------------------------- stream=


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def spin(cp, cycles=200_000_000):
    """Keep the current stream busy for ~0.1 s of GPU time."""
    cp.RawKernel(_SPIN, "spin")((1,), (1,), (np.int64(cycles),))


@pytest.mark.parametrize("kind", ["cupy", "int"])
def test_the_call_runs_on_the_stream_it_is_given(kind):
    # the stream first sleeps, then overwrites the inputs; a call on any other stream would
    # read the old inputs (the stream is non-blocking: no implicit ordering with the null stream)
    cp = arrays.cupy()
    p, dev, new, expected, out = warmed_stream_case(41, on_device, empty_out, cp.cuda.Device().synchronize)
    s = side_stream()
    with s:
        spin(cp)
        for d, x in zip(dev, new):
            cp.copyto(d, x)
    before = cp.cuda.get_current_stream()
    res = indexer.score_topk(*dev, p.top_k, return_scores=True, validate=False, out=out,
                             stream=s if kind == "cupy" else s.ptr)
    assert res is out
    assert cp.cuda.get_current_stream() == before  # the caller's current stream is left as it was
    s.synchronize()
    np.testing.assert_array_equal(out[0].get(), expected[0].get())
    assert out[1].get().tobytes() == expected[1].get().tobytes()


def test_concurrent_calls_from_four_threads_each_on_its_own_stream():
    cp = arrays.cupy()
    problems = [[testing.random_problem(np.random.default_rng(100 + 10 * i + j), T=3, H=16, D=64, E=32,
                                        lens=None, L=20, top_k=48) for j in range(3)] for i in range(4)]
    device = cp.cuda.runtime.getDevice()
    check_threads(problems, lambda i: device)


def test_graph_captured_before_the_workspace_grows_stays_valid():
    """A graph captured on a small call, then a larger eager call that grows the workspace
    (generation moves): the buffers the graph uses are kept, not freed, so it still replays
    new inputs right and writes into no memory CuPy has handed out since; buffers allocated
    after the capture are freed as before."""
    cp = arrays.cupy()
    small, small2 = pair_of_problems(38, T=2, H=64, D=128, E=64, lens=6000, top_k=128)
    big = testing.random_problem(np.random.default_rng(39), T=16, H=64, D=128, E=64, lens=9000, top_k=128)
    bigger = testing.random_problem(np.random.default_rng(40), T=32, H=64, D=128, E=64, lens=9000, top_k=128)
    dev = on_device(small)
    ws, out = indexer.Workspace(), empty_out(2, 128)
    kw = dict(return_scores=True, validate=False, workspace=ws)
    stream = side_stream()
    with stream:
        indexer.score_topk(*dev, small.top_k, out=out, **kw)  # warm-up: sizes ws for the small call
        stream.synchronize()
        captured = {k: int(b.data.ptr) for k, b in ws._buffers.items()}
        stream.begin_capture()
        try:
            indexer.score_topk(*dev, small.top_k, out=out, **kw)
        finally:
            graph = stream.end_capture()
        generation = ws.generation
        got_big = indexer.score_topk(*on_device(big), big.top_k, **kw)  # grows the workspace
        stream.synchronize()
        assert ws.generation > generation
        kept = {int(b.data.ptr) for b in ws._retired}
        assert kept and kept <= set(captured.values())  # the graph's buffers, and only those
        retired = len(ws._retired)
        indexer.score_topk(*on_device(bigger), bigger.top_k, **kw)  # grows again: nothing captured since
        stream.synchronize()
        assert len(ws._retired) == retired
        junk = [cp.full(1 << 20, 123, dtype=cp.uint8) for _ in range(16)]
        refill(dev, small2)
        graph.launch(stream)
        stream.synchronize()
    assert all(int(cp.count_nonzero(j != 123)) == 0 for j in junk)
    testing.check_topk(small2, out[0].get(), out[1].get(), tol=testing.TOL_FAST)
    testing.check_topk(big, got_big[0].get(), got_big[1].get(), tol=testing.TOL_FAST)
    eager = indexer.score_topk(*on_device(small2), small2.top_k, return_scores=True)
    np.testing.assert_array_equal(out[0].get(), eager[0].get())


def test_prepared_calls_graphs_keep_no_outgrown_buffer():
    """A PreparedCall captures its graphs again after a growth, so its captures keep nothing."""
    p = testing.random_problem(np.random.default_rng(41), T=2, H=64, D=128, E=64, lens=6000, top_k=128)
    big = testing.random_problem(np.random.default_rng(42), T=16, H=64, D=128, E=64, lens=9000, top_k=128)
    dev = on_device(p)
    step = indexer.prepare(*dev, p.top_k)
    out = empty_out(2, 128, scores=False)
    for _ in range(3):  # the second call with these pointers captures a graph, the third replays it
        step(*dev, out=out)
    indexer.score_topk(*on_device(big), big.top_k, workspace=step.workspace)  # grows it
    arrays.cupy().cuda.Device().synchronize()
    assert not step.workspace._retired
    step(*dev, out=out)  # captured again
    testing.check_topk(p, out.get(), tol=testing.TOL_FAST)
