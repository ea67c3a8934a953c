"""PyTorch callers: out= tensors written zero-copy, the call ordered on PyTorch's current
stream (or the stream given), and the step captured in a torch.cuda.CUDAGraph."""

import warnings

import numpy as np
import pytest

import indexer
from indexer import arrays, testing
from tests.gpu import pair_of_problems, requires_gpu, warmed_stream_case

pytestmark = [requires_gpu, pytest.mark.gpu]
torch = pytest.importorskip("torch")


def tensors(p):
    return [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in p.arrays()]


def empty_out(T, k):
    return (torch.full((T, k), -7, dtype=torch.int32, device="cuda"),
            torch.full((T, k), 7.0, dtype=torch.float32, device="cuda"))


def assert_same(got, expected):
    assert torch.equal(got[0], expected[0])
    assert got[1].cpu().numpy().tobytes() == expected[1].cpu().numpy().tobytes()


def test_out_tensors_are_returned_and_filled():
    p = testing.random_problem(np.random.default_rng(50), T=4, H=16, D=64, E=16, L=4, top_k=20)
    x = tensors(p)
    out = empty_out(4, 20)
    assert indexer.score_topk(*x, p.top_k, return_scores=True, out=out) is out
    assert_same(out, indexer.score_topk(*x, p.top_k, return_scores=True))
    testing.check_topk(p, out[0].cpu().numpy(), out[1].cpu().numpy(), tol=testing.TOL_FAST)
    idx = out[0]
    assert indexer.score_topk(*x, p.top_k, physical=True, out=idx) is idx


def test_bad_out_tensors_name_the_argument():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(51), T=3, H=8, D=64, E=16, L=3, top_k=12)
    x = tensors(p)
    with pytest.raises(TypeError, match="^out: expected a PyTorch CUDA tensor like q, got ndarray"):
        indexer.score_topk(*x, p.top_k, out=cp.empty((3, 12), dtype=cp.int32))
    with pytest.raises(TypeError, match="^out: expected a PyTorch CUDA tensor"):
        indexer.score_topk(*x, p.top_k, out=torch.empty((3, 12), dtype=torch.int32))  # on the host
    with pytest.raises(TypeError, match="^out: expected int32"):
        indexer.score_topk(*x, p.top_k, out=torch.empty((3, 12), dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="^out: expected a C-contiguous"):
        indexer.score_topk(*x, p.top_k, out=torch.empty((12, 3), dtype=torch.int32, device="cuda").t())


def test_out_tensor_overlapping_an_input_tensor_is_refused():
    p = testing.random_problem(np.random.default_rng(52), T=3, H=8, D=64, E=16, L=3, top_k=12)
    x = tensors(p)
    raw = torch.empty(3 + 3 * 12, dtype=torch.int32, device="cuda")
    raw[:3] = x[6]
    x[6] = raw[:3]  # valid_lens, then out from its last entry on
    with pytest.raises(ValueError, match="^out: expected memory of its own, got an array overlapping valid_lens$"):
        indexer.score_topk(*x, p.top_k, out=raw[2:38].view(3, 12))
    assert x[6].cpu().numpy().tolist() == p.valid_lens.tolist()
    out = raw[3:].view(3, 12)  # just past it
    assert indexer.score_topk(*x, p.top_k, out=out) is out
    testing.check_topk(p, out.cpu().numpy(), tol=testing.TOL_FAST)


def _sleep_then_refill(x, new):
    """On the current torch stream: ~0.1 s of GPU sleep, then overwrite the inputs in place.
    Work on any other stream would see the old inputs (torch's side streams do not wait
    for, nor make wait, the legacy default stream)."""
    torch.cuda._sleep(200_000_000)
    for a, b in zip(x, new):
        a.copy_(b, non_blocking=True)


def test_the_call_runs_on_torchs_current_stream():
    p, x, new, expected, out = warmed_stream_case(52, tensors, empty_out, torch.cuda.synchronize)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _sleep_then_refill(x, new)
        assert indexer.score_topk(*x, p.top_k, return_scores=True, validate=False, out=out) is out
        finished = torch.cuda.Event()
        finished.record(side)
    assert not finished.query()  # nothing waited on the host: the sleep is still running
    side.synchronize()  # only that stream
    assert_same(out, expected)
    # and without out=: the returned tensors are ordered on that stream too
    old = tensors(p)  # uploaded before: a host-to-device copy would wait for the sleep
    with torch.cuda.stream(side):
        _sleep_then_refill(x, old)
        res = indexer.score_topk(*x, p.top_k, return_scores=True, validate=False)
    side.synchronize()
    assert_same(res, indexer.score_topk(*old, p.top_k, return_scores=True))


@pytest.mark.parametrize("kind", ["torch", "int", "cupy"])
def test_the_call_runs_on_the_stream_it_is_given(kind):
    cp = arrays.cupy()
    p, x, new, expected, out = warmed_stream_case(53, tensors, empty_out, torch.cuda.synchronize)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        _sleep_then_refill(x, new)
    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream, which callers still pass
        warnings.simplefilter("ignore", DeprecationWarning)
        given = {"torch": side, "int": side.cuda_stream,
                 "cupy": cp.cuda.ExternalStream(side.cuda_stream, torch.cuda.current_device())}[kind]
    # called while torch's current stream is the default one: the argument wins
    indexer.score_topk(*x, p.top_k, return_scores=True, validate=False, out=out, stream=given)
    side.synchronize()
    assert_same(out, expected)


def test_torch_cuda_graph_capture_and_replay():
    p, p2 = pair_of_problems(54, T=4, H=64, D=128, E=64, lens=3000, top_k=256)
    x = tensors(p)
    ws, out = indexer.Workspace(), empty_out(4, 256)
    kw = dict(return_scores=True, validate=False, workspace=ws, out=out)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as PyTorch recommends
        indexer.score_topk(*x, p.top_k, **kw)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    n = ws.nbytes
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = indexer.score_topk(*x, p.top_k, **kw)
    assert res is out and ws.nbytes == n
    for a, b in zip(x, tensors(p2)):  # new values, same addresses
        a.copy_(b)
    graph.replay()
    torch.cuda.synchronize()
    eager = indexer.score_topk(*x, p.top_k, return_scores=True)
    assert_same(out, eager)
    testing.check_topk(p2, out[0].cpu().numpy(), out[1].cpu().numpy(), tol=testing.TOL_FAST)
    for a, b in zip(x, tensors(p)):  # and back: the same graph, the first inputs
        a.copy_(b)
    graph.replay()
    torch.cuda.synchronize()
    assert_same(out, indexer.score_topk(*tensors(p), p.top_k, return_scores=True))


def test_key_pool_with_tensors_and_out():
    rng = np.random.default_rng(55)
    pool = indexer.KeyPool(16, entries_per_block=16, head_dim=64, device="cuda")
    for seq, n in (("a", 70), ("b", 9)):
        pool.append(seq, torch.randn(n, 64, device="cuda"))
    q = torch.from_numpy(rng.standard_normal((2, 8, 64)).astype(np.float32)).cuda()
    w = torch.from_numpy(rng.standard_normal((2, 8)).astype(np.float32)).cuda()
    out = torch.empty((2, 12), dtype=torch.int32, device="cuda")
    ws = indexer.Workspace()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert pool.score_topk(q, w, ["a", "b"], 12, out=out, workspace=ws) is out
    side.synchronize()
    assert ws.nbytes > 0
    expected = pool.score_topk(q, w, ["a", "b"], 12)
    assert torch.equal(out, expected)


def _by_dlpack(cp, t):
    """What CuPy's DLPack import gives for t: ("ok", values) or ("error", exception type)."""
    try:
        return "ok", cp.from_dlpack(t).get()
    except Exception as exc:  # noqa: BLE001
        return "error", type(exc)


def same_strides(view, t):
    """Whether CuPy view ``view`` steps through memory as tensor ``t`` does: the same byte
    strides in every dimension longer than 1 (a dimension of one element is never stepped,
    and a contiguous tensor's view takes CuPy's own strides there)."""
    return all(vs == ts * t.element_size() for n, vs, ts in zip(t.shape, view.strides, t.stride()) if n > 1)


def test_tensors_on_torchs_stream_are_viewed_from_their_pointers(monkeypatch):
    cp = arrays.cupy()
    base = torch.arange(2 * 6 * 4, dtype=torch.float32, device="cuda").reshape(2, 6, 4) - 7.5
    cases = [
        base,
        base.transpose(0, 2),                      # not contiguous
        base[1, 2:, 1:3],                          # a storage offset and a gap between rows
        base[:, ::2],                              # strided
        (base * 3).to(torch.int32),
        (base.abs() % 200).to(torch.uint8),
        base.to(torch.float16),
        base > 0,
        base.to(torch.int64)[0],
        torch.tensor(2.5, device="cuda"),           # 0-d
    ]
    expected = [t.cpu().numpy() for t in cases]
    monkeypatch.setattr(cp, "from_dlpack", lambda *a, **k: pytest.fail("DLPack used"))
    for t, want in zip(cases, expected):
        view = arrays.to_cupy(t, ordered=True)
        assert view.data.ptr == t.data_ptr()
        assert view.shape == tuple(t.shape) and view.dtype == want.dtype
        assert same_strides(view, t)
        np.testing.assert_array_equal(view.get(), want)
    view = arrays.to_cupy(cases[2], ordered=True)  # the same memory: a write shows in the tensor
    view[0, 1] = 1234.0
    torch.cuda.synchronize()
    assert base[1, 2, 2].item() == 1234.0
    del view, cases
    import gc
    gc.collect()
    kept = arrays.to_cupy(torch.full((5,), 3.0, device="cuda"), ordered=True)  # the view keeps its tensor alive
    torch.empty(5, device="cuda").fill_(-1.0)
    np.testing.assert_array_equal(kept.get(), np.full(5, 3.0, dtype=np.float32))


def test_tensors_the_pointer_view_does_not_cover_go_through_dlpack():
    cp = arrays.cupy()
    t = torch.randn(3, 4, device="cuda")
    for x in (t.clone().requires_grad_(), t.to(torch.bfloat16), t[:0], t.cpu()):
        expected = _by_dlpack(cp, x)
        try:
            got = "ok", arrays.to_cupy(x, ordered=True).get()
        except Exception as exc:  # noqa: BLE001
            got = "error", type(exc)
        assert got[0] == expected[0], x
        if got[0] == "ok":
            np.testing.assert_array_equal(got[1], expected[1])
        else:
            assert got[1] is expected[1]
    # a lazily negated (or conjugated) tensor is refused: DLPack exports its memory without
    # the sign, which read as it lies would be the tensor's negation
    for x in (torch._neg_view(t), torch._neg_view(t.to(torch.int32))):
        for ordered in (True, False):
            with pytest.raises(BufferError, match="lazy negation or conjugation bit"):
                arrays.to_cupy(x, ordered=ordered)


def test_calls_on_torchs_stream_skip_dlpack_and_calls_on_another_stream_take_it(monkeypatch):
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(56), T=3, H=64, D=128, E=64, lens=[3000, 1, 900], top_k=64)
    x = tensors(p)
    expected = indexer.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, return_scores=True)
    imported = []
    real = cp.from_dlpack
    monkeypatch.setattr(cp, "from_dlpack", lambda t, *a, **k: imported.append(t) or real(t, *a, **k))
    out = empty_out(3, 64)
    got = indexer.score_topk(*x, p.top_k, return_scores=True, out=out)
    assert got is out and not imported  # inputs and out= viewed from their pointers
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    other = indexer.score_topk(*x, p.top_k, return_scores=True, stream=side)
    side.synchronize()
    assert len(imported) == 7  # another stream than torch's current: DLPack orders the two
    for res in (got, other):
        np.testing.assert_array_equal(res[0].cpu().numpy(), expected[0].get())
        assert res[1].cpu().numpy().tobytes() == expected[1].get().tobytes()


def test_ragged_calls_with_tensors():
    from tests.test_ragged import as_problem, grouped_problem

    cp = arrays.cupy()
    args = grouped_problem(np.random.default_rng(57), [3, 0, 2, 1], H=64, D=128, E=64, seq_entries=[700] * 4,
                           ratio=None, top_k=32)
    x = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in args]
    idx, sc = indexer.score_topk_ragged(*x, 32, return_scores=True)
    assert isinstance(idx, torch.Tensor) and idx.is_cuda
    testing.check_topk(as_problem(*args, 32), idx.cpu().numpy(), sc.cpu().numpy(), tol=testing.TOL_FAST)
    on_cupy = indexer.score_topk_ragged(*[cp.asarray(a) for a in args], 32, return_scores=True)
    np.testing.assert_array_equal(idx.cpu().numpy(), on_cupy[0].get())


def test_pointer_views_of_drawn_slices_match_the_tensor():
    """Drawn shapes, dtypes and slices (offsets, steps, transposes): each view sits at the
    tensor's first element with its strides and reads the tensor's values."""
    pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings, strategies as st

    dtypes = [torch.float32, torch.float16, torch.int32, torch.uint8, torch.int64, torch.bool]

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), dtype=st.sampled_from(dtypes),
           data=st.data())
    def check(shape, dtype, data):
        base = (torch.arange(int(np.prod(shape)), device="cuda") * 7 % 251 - 100).reshape(shape).to(dtype)
        index = []
        for n in shape:
            start = data.draw(st.integers(0, n - 1))
            stop = data.draw(st.integers(start + 1, n))
            index.append(slice(start, stop, data.draw(st.integers(1, 3))))
        t = base[tuple(index)]
        if data.draw(st.booleans()) and t.dim() >= 2:
            t = t.transpose(0, t.dim() - 1)
        view = arrays.to_cupy(t, ordered=True)
        assert view.data.ptr == t.data_ptr()
        assert same_strides(view, t)
        np.testing.assert_array_equal(view.get(), t.cpu().numpy())

    check()


def test_torch_stream_pointer_is_torchs_current_stream(monkeypatch):
    """The raw query and the public ``Stream`` give the same ``cudaStream_t``, on the
    default stream and inside ``torch.cuda.stream``; without the raw query the public one
    answers."""
    from indexer import streams

    def both():
        return streams.torch_stream_ptr(torch, 0), torch.cuda.current_stream(0).cuda_stream

    fast, public = both()
    assert fast == public
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        fast, public = both()
        assert fast == public == side.cuda_stream
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    with torch.cuda.stream(side):
        assert streams.torch_stream_ptr(torch, 0) == side.cuda_stream
    assert streams.torch_stream_ptr(torch, 0) == torch.cuda.current_stream(0).cuda_stream


def test_tensors_dlpack_refuses_are_refused_by_name():
    """A tensor DLPack will not export (a gradient to keep, a lazy negation or conjugation
    bit) is refused naming its argument, as the NumPy backend does, on PyTorch's stream and
    on another; nothing is written into out."""
    p = testing.random_problem(np.random.default_rng(61), T=2, H=8, D=64, E=16, lens=[40, 7], L=3, top_k=5)
    x = tensors(p)
    cases = [(1, x[1].clone().requires_grad_(), "^w: expected a tensor that does not require grad"),
             (1, torch._neg_view(x[1]), "^w: expected a tensor without a lazy negation bit"),
             (6, torch._neg_view(x[6]), "^valid_lens: expected a tensor without a lazy negation bit"),
             (0, x[0].clone().requires_grad_(), "^q: expected a tensor that does not require grad")]
    for stream in (None, torch.cuda.Stream()):
        for i, bad, match in cases:
            args = list(x)
            args[i] = bad
            out = empty_out(2, 5)
            with pytest.raises(TypeError, match=match):
                indexer.score_topk(*args, 5, return_scores=True, out=out, stream=stream)
            assert (out[0] == -7).all() and (out[1] == 7.0).all()
    with pytest.raises(TypeError, match=r"^out\[1\]: expected a tensor that does not require grad"):
        indexer.score_topk(*x, 5, return_scores=True, out=(empty_out(2, 5)[0], torch.zeros(2, 5, device="cuda",
                                                                                             requires_grad=True)))


def test_write_keys_refuses_a_pool_tensor_that_requires_grad_by_name():
    pool = [torch.zeros((4, 8, 32), dtype=torch.uint8, device="cuda"),
            torch.zeros((4, 8, 4), dtype=torch.uint8, device="cuda"),
            torch.ones(4, device="cuda").requires_grad_()]
    keys, slots = torch.ones((2, 64), device="cuda"), torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="^key_gscale: expected a tensor that does not require grad"):
        indexer.write_keys(keys, slots, *pool)
    pool[2] = pool[2].detach()
    # keys lazily negated: DLPack would export them unnegated, so they are refused by name
    with pytest.raises(TypeError, match="^keys: expected a tensor without a lazy negation bit"):
        indexer.write_keys(torch._neg_view(keys), slots, *pool)
    assert not pool[0].any() and not pool[1].any()


def test_host_tensors_on_a_gpu_machine_are_taken_as_numpy_arrays():
    """backend 'auto' (the GPU here) and 'cuda' take PyTorch tensors on the host as they take
    NumPy arrays: copied to the device, NumPy results, bit for bit the NumPy arrays' (before,
    a TypeError naming q); the grouped call and a prepared call too, and a bfloat16 q as its
    float32 values."""
    from tests.test_ragged import grouped_problem  # noqa: PLC0415

    p = testing.random_problem(np.random.default_rng(91), T=3, H=64, D=128, E=64, lens=[700, 0, 90], top_k=64)
    host = [torch.from_numpy(np.ascontiguousarray(a)) for a in p.arrays()]
    want = indexer.score_topk(*p.arrays(), 64, return_scores=True)  # NumPy arrays: the GPU path here
    testing.check_topk(p, *want, tol=testing.TOL_FAST)
    step = indexer.prepare(*host, 64, return_scores=True)
    assert step.backend == "cuda"
    for got in (indexer.score_topk(*host, 64, return_scores=True),
                indexer.score_topk(*host, 64, return_scores=True, backend="cuda"), step(*host)):
        assert isinstance(got[0], np.ndarray) and isinstance(got[1], np.ndarray)
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
    q16 = host[0].to(torch.bfloat16)
    got = indexer.score_topk(q16, *host[1:], 64, return_scores=True)
    want16 = indexer.score_topk(q16.float().numpy(), *p.arrays()[1:], 64, return_scores=True)
    assert got[0].tobytes() == want16[0].tobytes() and got[1].tobytes() == want16[1].tobytes()
    args = grouped_problem(np.random.default_rng(92), [2, 0, 3], H=64, D=128, E=64, seq_entries=[900, 64, 300],
                           top_k=32)
    want = indexer.score_topk_ragged(*args, 32, return_scores=True)
    got = indexer.score_topk_ragged(*[torch.from_numpy(np.ascontiguousarray(a)) for a in args], 32,
                                    return_scores=True)
    assert isinstance(got[0], np.ndarray)
    assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
    # out= inside a bfloat16 q's own memory: refused on the GPU path too (q goes as a widened copy)
    buf = torch.zeros(p.q.size + 64 * 3, dtype=torch.int32)
    qb = buf.view(torch.bfloat16)[: p.q.size].view(p.q.shape)
    qb.copy_(host[0].to(torch.bfloat16))
    kept = qb.view(torch.uint8).clone()
    with pytest.raises(ValueError, match="^out: expected memory of its own, got an array overlapping q"):
        indexer.score_topk(qb, *host[1:], 64, out=buf[: 3 * 64].view(3, 64).numpy())
    assert torch.equal(qb.view(torch.uint8), kept)
    # a call prepared on host tensors refuses CUDA ones by name (it would return CUDA results)
    with pytest.raises(ValueError, match="^q: expected a tensor on the host as prepared, got one on cuda"):
        step(host[0].cuda(), *host[1:])


def test_causal_lens_of_a_cuda_tensor_is_a_cuda_tensor():
    """Offsets as a PyTorch CUDA tensor: the lengths come back as one, on its device, equal to
    the NumPy array's (before, a TypeError); a CUDA tensor that requires grad is refused by name."""
    want = indexer.causal_lens(np.array([0, 4, 6], np.int32), ratio=2, context_lens=np.array([3, 0]))
    got = indexer.causal_lens(torch.tensor([0, 4, 6], dtype=torch.int32, device="cuda"), ratio=2,
                              context_lens=torch.tensor([3, 0], device="cuda"))
    assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == torch.int32
    assert (got.cpu().numpy() == want).all()
    with pytest.raises(TypeError, match="^cu_seqlens_q: expected a tensor that does not require grad"):
        indexer.causal_lens(torch.tensor([0.0, 4.0], device="cuda", requires_grad=True))
