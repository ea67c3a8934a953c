"""indexer.prepare on the GPU: bit for bit score_topk's answers (the same kernels) on fresh
inputs of the prepared shapes, with CuPy arrays and PyTorch tensors, grouped calls, out=,
stream=, CUDA graphs, and every argument unlike the prepared ones refused by name."""

import contextlib

import numpy as np
import pytest

import indexer
from indexer import arrays, testing
from tests.gpu import in_one_buffer, pairs_at_any_work, requires_gpu, side_stream
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]

TOL = {"exact": testing.TOL_EXACT, "fast": testing.TOL_FAST}


def on_device(xs):
    cp = arrays.cupy()
    return [cp.asarray(x) for x in xs]


def same(a, b):
    """Bit-identical results (indices, or (indices, scores) pairs) of any framework."""
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for x, y in zip(a, b):
        x = x.cpu().numpy() if hasattr(x, "cpu") else arrays.to_numpy(x)
        y = y.cpu().numpy() if hasattr(y, "cpu") else arrays.to_numpy(y)
        assert x.tobytes() == y.tobytes()


# (T, H, D, E, L, lens, top_k): batch 1 over a long row (the warp-specialised kernel), a batch
# of rows (one of them empty), small heads (the mma.sync kernel), and lengths off block edges
SHAPES = [
    dict(T=1, H=64, D=128, E=64, L=300, lens=19_000, top_k=512),
    dict(T=5, H=64, D=128, E=64, L=40, lens=[2000, 0, 77, 2560, 1], top_k=256),
    dict(T=3, H=8, D=64, E=16, L=9, lens=[100, 7, 144], top_k=50),
]


@pytest.mark.parametrize("precision", ["fast", "exact"])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_calls_equal_score_topk_on_fresh_inputs(shape, precision):
    kw = SHAPES[shape]
    first = testing.random_problem(np.random.default_rng(100 + shape), **kw)
    step = indexer.prepare(*on_device(first.arrays()), first.top_k, precision=precision, return_scores=True)
    assert step.backend == "cuda"
    for seed in (1, 2):
        p = testing.random_problem(np.random.default_rng(seed * 10 + shape), **kw)
        dev = on_device(p.arrays())
        got = step(*dev)
        same(got, indexer.score_topk(*dev, p.top_k, precision=precision, return_scores=True, validate=False))
        testing.check_topk(p, got[0].get(), got[1].get(), tol=TOL[precision])


@pytest.mark.parametrize("any_work", [False, True])
def test_grouped_calls_equal_score_topk_ragged(any_work):
    # with the pair kernel's work bound at 0, these few rows take the pair kernel, as calls
    # of more work do; with it as it is, they go alone
    with pairs_at_any_work() if any_work else contextlib.nullcontext():
        _grouped_calls_equal_score_topk_ragged(any_work)


def _grouped_calls_equal_score_topk_ragged(any_work):
    rng = np.random.default_rng(7)
    # two draft tokens a request, a request without queries
    args = grouped_problem(rng, [2, 2, 0, 2], H=64, D=128, E=64, seq_entries=[3000, 700, 64, 1500], top_k=128)
    q, w, k, s, g, table, cu, lens = on_device(args)
    step = indexer.prepare(q, w, k, s, g, table, lens, 128, cu_seqlens_q=cu, physical=True)
    got = step(q, w, k, s, g, table, lens, cu_seqlens_q=cu)
    # six rows of up to 3,000 entries: the single-query kernel, or the pair kernel at any work
    assert step._plan.kind == ("pairs" if any_work else "wgmma")
    same(got, indexer.score_topk_ragged(q, w, k, s, g, table, cu, lens, 128, physical=True))
    testing.check_topk(as_problem(*args, 128), got.get(), tol=testing.TOL_FAST, physical=True)  # and right
    # new queries and lengths in the same shapes
    q2, w2 = on_device(grouped_problem(np.random.default_rng(8), [2, 2, 0, 2], H=64, D=128, E=64,
                                       seq_entries=[3000, 700, 64, 1500], top_k=128)[:2])
    lens2 = lens // 2
    same(step(q2, w2, k, s, g, table, lens2, cu_seqlens_q=cu),
         indexer.score_topk_ragged(q2, w2, k, s, g, table, cu, lens2, 128, physical=True))


def test_out_stream_and_no_allocation():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(9), T=2, H=64, D=128, E=64, L=60, lens=[3000, 3840],
                               top_k=512)
    dev = on_device(p.arrays())
    step = indexer.prepare(*dev, p.top_k, validate=False)
    out = cp.full((2, 512), -7, dtype=cp.int32)
    stream = side_stream()
    assert step(*dev, out=out, stream=stream) is out  # sizes the workspace
    stream.synchronize()

    def no_allocation(nbytes):
        raise AssertionError(f"the call allocated {nbytes} bytes from CuPy")

    out.fill(-7)
    with cp.cuda.using_allocator(no_allocation):
        assert step(*dev, out=out, stream=stream) is out
    stream.synchronize()
    same(out, indexer.score_topk(*dev, p.top_k))
    testing.check_topk(p, out.get(), tol=testing.TOL_FAST)


def test_graph_of_a_prepared_call_replays_new_inputs():
    cp = arrays.cupy()
    kw = dict(T=3, H=64, D=128, E=64, L=50, lens=[3100, 5, 2048], top_k=256)
    p = testing.random_problem(np.random.default_rng(11), **kw)
    p2 = testing.random_problem(np.random.default_rng(12), **kw)
    dev = on_device(p.arrays())
    step = indexer.prepare(*dev, p.top_k, return_scores=True)
    out = (cp.empty((3, 256), dtype=cp.int32), cp.empty((3, 256), dtype=cp.float32))
    stream = side_stream()
    with stream:
        step(*dev, out=out)  # warm-up: sizes the workspace
        stream.synchronize()
        stream.begin_capture()
        try:
            step(*dev, out=out)
        finally:
            graph = stream.end_capture()
        for d, h in zip(dev, p2.arrays()):
            cp.copyto(d, cp.asarray(h))
        graph.launch(stream)
        stream.synchronize()
    same(out, indexer.score_topk(*on_device(p2.arrays()), p2.top_k, return_scores=True))
    testing.check_topk(p2, out[0].get(), out[1].get(), tol=testing.TOL_FAST)


def test_a_query_off_the_prepared_alignment_takes_its_own_plan():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(13), T=1, H=64, D=128, E=64, L=40, lens=2500, top_k=128)
    dev = on_device(p.arrays())
    step = indexer.prepare(*dev, p.top_k)
    flat = cp.empty(p.q.size + 1, dtype=cp.float32)
    q_off = flat[1:].reshape(p.q.shape)  # contiguous, 4 bytes past a 16-byte boundary
    q_off[...] = dev[0]
    assert q_off.data.ptr % 16 == 4
    got = step(q_off, *dev[1:])
    same(got, indexer.score_topk(q_off, *dev[1:], p.top_k))
    testing.check_topk(p, got.get(), tol=testing.TOL_FAST)
    out = cp.empty_like(got)
    for _ in range(3):  # with out=: launched eagerly each time, never from a graph of the prepared plan
        out.fill(-7)
        same(step(q_off, *dev[1:], out=out), got)
    assert not step._graphs


def test_out_overlapping_a_query_off_the_prepared_alignment_is_refused():
    # such a call launches eagerly (never _replayed's pointer check): run_checked checks it
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(14), T=2, H=64, D=128, E=64, L=40, lens=[2500, 900], top_k=128)
    dev = on_device(p.arrays())
    step = indexer.prepare(*dev, p.top_k)
    flat = cp.empty(p.q.size + 2 * 128, dtype=cp.float32)
    q_off = flat[1 : 1 + p.q.size].reshape(p.q.shape)  # 4 bytes past a 16-byte boundary
    q_off[...] = dev[0]
    out = flat[p.q.size : p.q.size + 2 * 128].view(cp.int32).reshape(2, 128)  # from q_off's last float
    kept = q_off.copy()
    for _ in range(3):
        with pytest.raises(ValueError, match="^out: expected memory of its own, got an array overlapping q$"):
            step(q_off, *dev[1:], out=out)
    assert (q_off == kept).all() and not step._graphs


def test_validate_on_a_call_checks_the_values():
    p = testing.random_problem(np.random.default_rng(14), T=2, H=8, D=64, E=16, L=4, lens=[40, 64], top_k=10)
    dev = on_device(p.arrays())
    step = indexer.prepare(*dev, p.top_k)
    dev[5][1, 0] = p.keys_fp4.shape[0] + 5  # a visible block id outside the pool
    with pytest.raises(ValueError, match="^block_table: expected block ids in"):
        step(*dev, validate=True)
    step(*dev)  # unchecked: the kernels skip the block, and read nothing outside the pool


def test_arrays_unlike_the_prepared_ones_are_refused_by_name():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(15), T=2, H=8, D=64, E=16, L=4, lens=[40, 64], top_k=10)
    dev = on_device(p.arrays())
    step = indexer.prepare(*dev, p.top_k)
    cases = [
        (0, dev[0][:, :, :32], ValueError, r"^q: expected shape \(2, 8, 64\) as prepared"),
        (1, dev[1].astype(cp.float16), TypeError, "^w: expected dtype float32 as prepared"),
        (5, p.block_table, TypeError, "^block_table: expected a cupy.ndarray as prepared, got numpy.ndarray"),
        (0, cp.asfortranarray(dev[0]), ValueError, "^q: expected a C-contiguous array"),
    ]
    for i, x, error, message in cases:
        given = list(dev)
        given[i] = x
        with pytest.raises(error, match=message):
            step(*given)
    flat = cp.zeros(dev[2].size + 8, dtype=cp.uint8)
    keys_off = flat[8:].reshape(dev[2].shape)
    with pytest.raises(ValueError, match="^keys_fp4: expected a 16-byte aligned device array"):
        step(dev[0], dev[1], keys_off, *dev[3:])


def test_host_arrays_on_the_gpu_take_the_public_call():
    p = testing.random_problem(np.random.default_rng(16), T=2, H=8, D=64, E=16, L=4, lens=[40, 64], top_k=10)
    step = indexer.prepare(*p.args(), backend="cuda")
    got = step(*p.arrays())
    assert isinstance(got, np.ndarray)
    same(got, indexer.score_topk(*p.args(), backend="cuda"))


@pytest.mark.parametrize("name", testing.ARRAY_NAMES)
def test_host_arrays_out_of_order_are_refused_by_name_as_the_numpy_backend_refuses_them(name):
    """A NumPy array that is not C-contiguous: refused by both backends with one message
    (the GPU path's copy to the device would have put it in order unasked), by the public
    call, the grouped call and a prepared call; a PyTorch host tensor's view likewise."""
    p = testing.random_problem(np.random.default_rng(19), T=2, H=8, D=64, E=16, L=4, lens=[40, 64], top_k=10)
    given = dict(zip(testing.ARRAY_NAMES, p.arrays()))
    x = given[name]
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    wide[..., ::2] = x
    given[name] = wide[..., ::2]  # the same values, every second element
    assert not given[name].flags.c_contiguous
    message = f"^{name}: expected a C-contiguous array$"
    for backend in ("numpy", "cuda"):
        with pytest.raises(ValueError, match=message):
            indexer.score_topk(*given.values(), p.top_k, backend=backend)
    for backend in ("numpy", "cuda"):  # refused as prepared, not at each call after
        with pytest.raises(ValueError, match=message):
            indexer.prepare(*given.values(), p.top_k, backend=backend)
    step = indexer.prepare(*p.arrays(), p.top_k, backend="cuda")
    with pytest.raises(ValueError, match=message):
        step(*given.values())
    try:
        import torch  # noqa: PLC0415  (optional here)
    except ImportError:
        torch = None
    if torch is not None:
        tensors = [torch.from_numpy(a) for a in given.values()]
        with pytest.raises(ValueError, match=message):
            indexer.score_topk(*tensors, p.top_k, backend="cuda")
    cu = np.array([0, 1, 2], np.int32)  # (the table's two rows as two sequences' (B, L) table)
    for backend in ("numpy", "cuda"):
        with pytest.raises(ValueError, match=message):
            indexer.score_topk_ragged(*list(given.values())[:6], cu, given["valid_lens"], p.top_k, backend=backend)


def test_a_misaligned_out_refused_twice_leaves_the_graphs_on():
    """A misaligned ``out`` is refused by name at every call, before a capture (before, the
    second call with the same pointers tried to capture, failed inside it, and switched the
    prepared call's graphs off for good); a good call after it replays a graph."""
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(20), T=2, H=64, D=128, E=64, L=4, lens=[200, 256], top_k=16)
    dev = on_device(p.arrays())
    step = indexer.prepare(*dev, p.top_k)
    buf = cp.zeros(2 * 16 * 4 + 8, cp.uint8)
    bad = cp.ndarray((2, 16), cp.int32, memptr=buf.data + 2)
    for _ in range(3):
        with pytest.raises(ValueError, match="^out: expected a device array aligned to its 4-byte elements"):
            step(*dev, out=bad)
    good = cp.empty((2, 16), cp.int32)
    for _ in range(3):  # the second call with these pointers captures, the third replays
        assert step(*dev, out=good) is good
    assert step._graphs_on and len(step._graphs) == 1
    same(good, indexer.score_topk(*dev, p.top_k))


def test_torch_tensors_views_kept_and_contents_read_each_call():
    torch = pytest.importorskip("torch")
    kw = dict(T=2, H=64, D=128, E=64, L=40, lens=[2500, 1200], top_k=256)
    p = testing.random_problem(np.random.default_rng(17), **kw)
    p2 = testing.random_problem(np.random.default_rng(18), **kw)
    t = [torch.from_numpy(x).cuda() for x in p.arrays()]
    step = indexer.prepare(*t, p.top_k, return_scores=True)
    first = step(*t)
    assert isinstance(first[0], torch.Tensor)
    same(first, indexer.score_topk(*on_device(p.arrays()), p.top_k, return_scores=True))
    for x, h in zip(t, p2.arrays()):  # the same tensors refilled in place: their kept views read the new data
        x.copy_(torch.from_numpy(h))
    out = (torch.empty(2, 256, dtype=torch.int32, device="cuda"), torch.empty(2, 256, device="cuda"))
    assert step(*t, out=out) is out
    same(out, indexer.score_topk(*on_device(p2.arrays()), p2.top_k, return_scores=True))
    fresh = [torch.from_numpy(x).cuda() for x in p.arrays()]  # new tensors: new views
    same(step(*fresh), first)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        again = step(*fresh)
    side.synchronize()
    same(again, first)


def test_a_lazily_negated_tensor_at_a_kept_pointer_is_refused():
    """A negated view shares its tensor's pointer: a view or a graph kept for that pointer
    would read the memory unnegated, so the prepared call refuses it by name, as an input
    and as out, after calls that kept both."""
    torch = pytest.importorskip("torch")
    p = testing.random_problem(np.random.default_rng(19), T=2, H=64, D=128, E=64, L=40, lens=[2500, 1200], top_k=64)
    t = [torch.from_numpy(x).cuda() for x in p.arrays()]
    step = indexer.prepare(*t, p.top_k, return_scores=True)
    out = (torch.empty(2, 64, dtype=torch.int32, device="cuda"), torch.empty(2, 64, device="cuda"))
    for _ in range(3):  # views kept, a graph captured and replayed
        step(*t, out=out)
    want = tuple(o.clone() for o in out)
    for i in (0, 1):
        args = list(t)
        args[i] = torch._neg_view(t[i])
        with pytest.raises(TypeError, match=f"^{('q', 'w')[i]}: expected a tensor without a lazy negation bit"):
            step(*args, out=out)
    with pytest.raises(TypeError, match=r"^out\[1\]: expected a tensor without a lazy negation bit"):
        step(*t, out=(out[0], torch._neg_view(out[1])))
    with pytest.raises(TypeError, match=r"^out\[1\]: expected a tensor that does not require grad"):
        step(*t, out=(out[0], out[1].clone().requires_grad_()))
    same(step(*t, out=out), want)


def test_calls_with_out_are_replayed_from_a_graph_of_their_pointers():
    cp = arrays.cupy()
    # rows past the row select's reach: the select's histograms, kept zero at rest, are in use
    kw = dict(T=2, H=64, D=128, E=64, L=80, lens=[5000, 4200], top_k=256)
    problems = [testing.random_problem(np.random.default_rng(20 + i), **kw) for i in range(3)]
    dev = on_device(problems[0].arrays())
    step = indexer.prepare(*dev, 256, return_scores=True)
    assert step._plan.hist_bytes > 0
    out = (cp.empty((2, 256), dtype=cp.int32), cp.empty((2, 256), dtype=cp.float32))
    for i, p in enumerate(problems):  # eager, captured and replayed, replayed: new contents each time
        for d, h in zip(dev, p.arrays()):
            cp.copyto(d, cp.asarray(h))
        out[0].fill(-7)
        assert step(*dev, out=out) is out
        assert len(step._graphs) == (0 if i == 0 else 1)
        same(out, indexer.score_topk(*on_device(p.arrays()), 256, return_scores=True))
        testing.check_topk(p, out[0].get(), out[1].get(), tol=testing.TOL_FAST)
    other = (cp.empty_like(out[0]), cp.empty_like(out[1]))  # other pointers: another graph, from their second call
    step(*dev, out=other)
    step(*dev, out=other)
    assert len(step._graphs) == 2
    same(other, out)
    # the workspace grows (a larger call on it): the graphs over its old buffers are not replayed
    big = testing.random_problem(np.random.default_rng(30), T=8, H=64, D=128, E=64, L=200, lens=12_000, top_k=256)
    indexer.score_topk(*on_device(big.arrays()), 256, workspace=step.workspace)
    out[0].fill(-7)
    step(*dev, out=out)
    same(out, other)
    # an interrupted call left the histograms dirty: the launches run (and clear them)
    step.workspace.mark_zeroed(False)
    out[0].fill(-7)
    step(*dev, out=out)
    same(out, other)
    assert step.workspace.at_rest(dev[0].data.device_id)
    plain = indexer.prepare(*dev, 256, return_scores=True, graphs=False)
    plain(*dev, out=out)
    plain(*dev, out=out)
    assert not plain._graphs
    same(out, other)


def test_out_unlike_the_accepted_one_is_refused_once_replays_run():
    # the replay path remembers the dtype objects it accepted and reads CuPy's own contiguity
    # flag: an out of another dtype or layout must still be refused by name, not replayed
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(31), T=2, H=64, D=128, E=64, L=40, lens=[2000, 1500],
                               top_k=128)
    dev = on_device(p.arrays())
    step = indexer.prepare(*dev, 128, return_scores=True)
    out = (cp.empty((2, 128), dtype=cp.int32), cp.empty((2, 128), dtype=cp.float32))
    for _ in range(3):
        step(*dev, out=out)
    assert len(step._graphs) == 1
    wide = cp.empty((2, 256), dtype=cp.int32)
    cases = [
        ((out[0].astype(cp.int64), out[1]), r"^out\[0\]: expected int32 of shape \(T, top_k\) = \(2, 128\), got int64"),
        ((out[0], out[1].astype(cp.float64)), r"^out\[1\]: expected float32 of shape \(T, top_k\) = \(2, 128\), got float64"),
        ((out[0].view(cp.uint32), out[1]), r"^out\[0\]: expected int32 .* got uint32"),
        ((wide[:, ::2], out[1]), r"^out\[0\]: expected a C-contiguous array$"),
    ]
    for bad, message in cases:  # a wrong dtype is a wrong type (TypeError), a layout a wrong value
        with pytest.raises(ValueError if "C-contiguous" in message else TypeError, match=message):
            step(*dev, out=bad)
    same(step(*dev, out=out), indexer.score_topk(*dev, 128, return_scores=True))


def test_a_model_s_tensors_beside_a_pool_s_cupy_arrays():
    torch = pytest.importorskip("torch")
    kw = dict(T=3, H=64, D=128, E=64, L=80, lens=[5000, 10, 4200], top_k=256)
    p = testing.random_problem(np.random.default_rng(40), **kw)
    pool = on_device(p.arrays()[2:5])
    q, w, table, lens = (torch.from_numpy(x).cuda() for x in (p.q, p.w, p.block_table, p.valid_lens))
    step = indexer.prepare(q, w, *pool, table, lens, 256, physical=True)
    out = torch.empty(3, 256, dtype=torch.int32, device="cuda")
    want = indexer.score_topk(q, w, *pool, table, lens, 256, physical=True)
    for _ in range(3):  # eager, captured, replayed
        out.fill_(-7)
        assert step(q, w, *pool, table, lens, out=out) is out
        same(out, want)
    assert len(step._graphs) == 1
    testing.check_topk(p, out.cpu().numpy(), tol=testing.TOL_FAST, physical=True)


def test_a_capture_that_fails_falls_back_to_the_launches():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(50), T=2, H=64, D=128, E=64, L=80, lens=[5000, 300], top_k=128)
    dev = on_device(p.arrays())
    step = indexer.prepare(*dev, p.top_k)
    launch = step._launch

    def refuses_capture(given, out, ordered):
        if cp.cuda.get_current_stream().is_capturing():
            raise RuntimeError("not in a capture")
        return launch(given, out, ordered)

    step._launch = refuses_capture
    out = cp.empty((2, 128), dtype=cp.int32)
    want = indexer.score_topk(*dev, p.top_k)
    for _ in range(3):
        out.fill(-7)
        assert step(*dev, out=out) is out
        same(out, want)
    assert not step._graphs and not step._graphs_on


@pytest.mark.parametrize("which", [0, 6])
def test_out_overlapping_an_input_is_refused_every_call_and_graphs_stay_on(which):
    cp = arrays.cupy()
    names = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens")
    p = testing.random_problem(np.random.default_rng(60), T=2, H=64, D=128, E=64, L=80, lens=[5000, 300], top_k=128)
    dev = on_device(p.arrays())
    dev[which], out = in_one_buffer(dev[which], 2, 128, overlap=True, xp=cp)
    kept = dev[which].copy()
    step = indexer.prepare(*dev, p.top_k)
    for _ in range(3):  # the eager call's pointers, then those a graph would be captured for
        with pytest.raises(ValueError, match=f"^out: expected memory of its own, got an array overlapping {names[which]}$"):
            step(*dev, out=out)
    assert (dev[which] == kept).all() and step._graphs_on and not step._graphs
    _, apart = in_one_buffer(dev[which], 2, 128, overlap=False, xp=cp)
    want = indexer.score_topk(*dev, p.top_k)
    for _ in range(3):  # eager, captured, replayed
        apart.fill(-7)
        assert step(*dev, out=apart) is apart
        same(apart, want)
    assert len(step._graphs) == 1
