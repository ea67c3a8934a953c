"""float16, bfloat16 and float8_e4m3fn queries, read by the kernels where they lie
(kernels/common.cuh: half_bits, bf16_bits, e4m3_bits): every kernel that reads q (the exact
path's, the staging kernels', and the scoring kernels that stage the query themselves) must
give bit for bit what it gives for the same values widened to float32, and the reference's
top-k. float16 queries come as CuPy arrays, bfloat16 and float8 ones as PyTorch tensors
(CuPy has neither)."""

import numpy as np
import pytest

import indexer
from indexer import arrays, geometry, testing
from tests.gpu import requires_gpu
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]

DTYPES = ("float16", "bfloat16", "float8_e4m3fn")


def _hopper():
    from indexer import cuda_ops

    cp = arrays.cupy()
    return geometry.ws_supported(64, 128, cuda_ops.device_facts(cp.cuda.Device().id))


def narrowed(q, dtype):
    """(the narrower query on the GPU, its values widened to float32 on the host): a CuPy
    float16 array, or a PyTorch bfloat16 or float8_e4m3fn tensor."""
    cp = arrays.cupy()
    if dtype == "float16":
        q16 = cp.asarray(q.astype(np.float16))
        return q16, q16.get().astype(np.float32)
    torch = pytest.importorskip("torch")
    q16 = torch.from_numpy(q).cuda().to(getattr(torch, dtype))
    return q16, q16.float().cpu().numpy()


def on_gpu(arrays_, like):
    """The other arrays on the GPU, in ``like``'s framework (PyTorch with a tensor query)."""
    cp = arrays.cupy()
    dev = [cp.asarray(a) for a in arrays_]
    if arrays.framework_of(like) == "torch":
        import torch

        return [torch.from_dlpack(x) for x in dev]
    return dev


def host(x):
    return x.get() if arrays.is_cupy(x) else x.cpu().numpy()


def both(p, dtype, call):
    """``call(q, rest)`` with the 16-bit query and with its float32 widening: both results
    (host arrays) and the problem of the widened values (the reference's)."""
    q16, q32 = narrowed(p.q, dtype)
    rest = on_gpu(p.arrays()[1:], q16)
    got = [host(x) for x in call(q16, rest)]
    want = [host(x) for x in call(on_gpu([q32], q16)[0], rest)]
    widened = testing.Problem(q32, *p.arrays()[1:], p.top_k)
    return got, want, widened


def assert_same(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].tobytes() == want[1].tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,precision", [("auto", "fast"), ("mma", "fast"), ("wgmma-single", "fast"),
                                              ("ws", "fast"), ("auto", "exact")])
@pytest.mark.parametrize("H,D,E,T,lens", [
    (64, 128, 64, 3, [20_000, 129, 0]),  # long and off-edge rows, an empty one
    (64, 128, 64, 1, [65_536]),          # batch 1: the warp-specialised kernel's case
    (33, 64, 16, 4, [700, 1, 300, 5]),   # fewer heads than a block of them, another head dim
    (8, 256, 32, 2, [400, 90]),          # the largest head dim (mma.sync and the exact path only)
])
def test_single_rows_match_the_float32_query(dtype, kernel, precision, H, D, E, T, lens):
    from indexer import cuda_ops

    takes = {"ws": geometry.ws_supported, "wgmma-single": geometry.wgmma_supported}.get(kernel)
    if takes is not None and not (_hopper() and takes(H, D, geometry.H200, E)):
        pytest.skip("the wgmma kernels need Hopper, and take this shape only there")
    rng = np.random.default_rng(H * 31 + D + E + T)
    p = testing.random_problem(rng, T=T, H=H, D=D, E=E, lens=lens, top_k=64)
    p.q *= 3.0  # values past float16's 2**-14 normals and up to tens: the staging's scaling at work

    def call(q, rest):
        return cuda_ops.score_topk(q, *rest, p.top_k, precision=precision, return_scores=True, _fast_kernel=kernel)

    got, want, widened = both(p, dtype, call)
    assert_same(got, want)
    testing.check_topk(widened, got[0], got[1], tol=testing.TOL_FAST if precision == "fast" else testing.TOL_EXACT)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,image", [("pairs", True), ("pairs", False), ("ks", True), ("dense", True),
                                          ("wgmma-single", False)])
def test_grouped_rows_match_the_float32_query(dtype, kernel, image, monkeypatch):
    """The pair kernel from its images and staging the query itself, the keys-stationary and
    dense kernels (which take the rows of sequences), and the single-query wgmma kernel from
    prep_query_kernel's rows."""
    from indexer import cuda_ops

    if not _hopper():
        pytest.skip("Hopper's wgmma kernels")
    monkeypatch.setattr(cuda_ops, "_QUERY_IMAGE", image)
    cuda_ops.clear_plans()
    rng = np.random.default_rng(len(kernel) * 7 + image)
    counts, entries = [2, 3, 1, 40], [9_001, 700, 129, 2_048]
    args = grouped_problem(rng, counts, H=64, D=128, E=64, seq_entries=entries, top_k=48)
    p = as_problem(*args, 48)
    cp = arrays.cupy()

    def call(q, rest):
        cu = cp.asarray(args[6])
        return cuda_ops.score_topk(q, *rest, p.top_k, return_scores=True, _cu_seqlens=cu, _fast_kernel=kernel)

    try:
        got, want, widened = both(p, dtype, call)
    finally:
        cuda_ops.clear_plans()
    assert_same(got, want)
    testing.check_topk(widened, got[0], got[1], tol=testing.TOL_FAST)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_and_nan_queries(dtype):
    """Heads of very different magnitudes (each scaled apart by its power of two), float16's
    subnormals and largest values, bfloat16 past float16's range, and a NaN (never selected)."""
    rng = np.random.default_rng(5)
    p = testing.random_problem(rng, T=3, H=64, D=128, E=64, lens=[5_000, 3_000, 64], top_k=40)
    big = {"float16": 6e4, "float8_e4m3fn": 448.0}.get(dtype, 1e30)
    p.q[0, :8] *= 1e-6
    p.q[0, 8:16] = np.clip(p.q[0, 8:16] * big, -big, big)
    p.q[1, 3, 7] = np.nan

    def call(q, rest):
        return indexer.score_topk(q, *rest, p.top_k, return_scores=True)

    got, want, widened = both(p, dtype, call)
    assert_same(got, want)
    testing.check_topk(widened, got[0], got[1], tol=testing.TOL_FAST)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_a_narrow_query_off_16_byte_alignment_and_a_prepared_call(dtype):
    """Batch 1: the warp-specialised kernel stages an aligned query by 8-byte (bfloat16) or
    4-byte (float8) loads of its bits; a view 8 bytes into its buffer takes the staging
    kernel's path instead (as a float32 query 8 bytes off does); a prepared call replayed
    from its CUDA graph."""
    torch = pytest.importorskip("torch")
    from indexer import cuda_ops

    if not _hopper():
        pytest.skip("the warp-specialised kernel is a Hopper kernel")
    rng = np.random.default_rng(11)
    p = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=[40_000], top_k=32)
    q16, q32 = narrowed(p.q, dtype)
    rest = on_gpu(p.arrays()[1:], q16)
    widened = testing.Problem(q32, *p.arrays()[1:], p.top_k)

    def shifted(q):  # q's values 8 bytes into a buffer of their dtype
        buf = torch.empty(q.numel() * q.element_size() + 8, dtype=torch.uint8, device="cuda")
        view = buf[8:].view(q.dtype).view(q.shape)
        view.copy_(q)
        assert view.data_ptr() % 16 == 8
        return view

    def call(q):
        cuda_ops.clear_plans()
        got = [host(x) for x in indexer.score_topk(q, *rest, p.top_k, return_scores=True)]
        (plan,) = cuda_ops._PLANS.values()
        return plan.kind, got

    q32_dev = on_gpu([q32], q16)[0]
    for make, kind in ((lambda q: q, "ws"), (shifted, "wgmma")):
        kind16, got = call(make(q16))
        kind32, want = call(make(q32_dev))
        assert kind16 == kind32 == kind
        assert_same(got, want)
        testing.check_topk(widened, got[0], got[1], tol=testing.TOL_FAST)

    want = [host(x) for x in indexer.score_topk(q32_dev, *rest, p.top_k, return_scores=True)]
    step = indexer.prepare(q16, *rest, p.top_k, return_scores=True)
    out = (torch.empty((1, 32), dtype=torch.int32, device="cuda"), torch.empty((1, 32), device="cuda"))
    for _ in range(3):  # eager, captured, replayed
        out[0].fill_(-7)
        step(q16, *rest, out=out)
        assert_same([host(x) for x in out], want)
    assert len(step._graphs) == 1


def test_query_dtypes_refused_by_name():
    torch = pytest.importorskip("torch")
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(3), T=2, H=8, D=64, E=16, lens=40, top_k=8)
    rest = [cp.asarray(a) for a in p.arrays()[1:]]
    with pytest.raises(TypeError, match="^q: expected dtype float32, float16, bfloat16 or float8_e4m3fn, got uint16"):
        indexer.score_topk(cp.asarray(p.q).view(cp.uint16)[..., ::2].copy(), *rest, 8)  # bits, but not a bfloat16's
    with pytest.raises(TypeError, match="^q: expected dtype float32, float16, bfloat16 or float8_e4m3fn, got uint8"):
        indexer.score_topk(cp.asarray(p.q).view(cp.uint8)[..., ::4].copy(), *rest, 8)  # nor a float8's
    with pytest.raises(TypeError, match="^q: expected dtype float32, float16, bfloat16 or float8_e4m3fn, got float64"):
        indexer.score_topk(cp.asarray(p.q, dtype=cp.float64), *rest, 8)
    with pytest.raises(TypeError, match="^q: expected a tensor that does not require grad"):
        indexer.score_topk(torch.from_numpy(p.q).cuda().to(torch.bfloat16).requires_grad_(), *rest, 8)


def test_arrays_off_their_element_alignment_and_dtypes_cupy_lacks_are_refused_by_name():
    """A CuPy view cut at an odd byte offset would fault the kernels' whole-element loads
    (a sticky error that ends the CUDA context): refused before any launch, by the public
    call and by a prepared call's eager and replayed paths alike; a bfloat16 ``w`` or ``out``
    (CuPy has no bfloat16) is refused by name too, where CuPy's own conversion error named
    nothing. The call after them still gives the right answer."""
    torch = pytest.importorskip("torch")
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(5), T=2, H=8, D=64, E=16, lens=[50, 20], top_k=8)
    dev = [cp.asarray(a) for a in p.arrays()]

    def off_by(x, nbytes):  # x's values nbytes into a buffer
        buf = cp.empty(x.nbytes + 8, cp.uint8)
        view = cp.ndarray(x.shape, x.dtype, memptr=buf.data + nbytes)
        view[...] = x
        return view

    for i, name, nbytes in ((0, "q", 2), (1, "w", 1), (4, "key_gscale", 2), (6, "valid_lens", 3)):
        args = list(dev)
        args[i] = off_by(dev[i], nbytes)
        with pytest.raises(ValueError, match=f"^{name}: expected a device array aligned to its"):
            indexer.score_topk(*args, 8, validate=False)
    step = indexer.prepare(*dev, 8)
    with pytest.raises(ValueError, match="^w: expected a device array aligned to its 4-byte elements"):
        step(dev[0], off_by(dev[1], 2), *dev[2:])
    odd_out = off_by(cp.empty((2, 8), cp.int32), 2)
    with pytest.raises(ValueError, match="^out: expected a device array aligned to its 4-byte elements"):
        indexer.score_topk(*dev, 8, out=odd_out)
    tensors = [torch.from_numpy(a).cuda() for a in p.arrays()]
    with pytest.raises(TypeError, match="^w: expected dtype float32, got torch.bfloat16"):
        indexer.score_topk(tensors[0], tensors[1].to(torch.bfloat16), *tensors[2:], 8)
    with pytest.raises(TypeError, match=r"^out\[1\]: expected float32 of shape \(T, top_k\) = \(2, 8\), got torch.bfloat16"):
        indexer.score_topk(*tensors, 8, return_scores=True,
                           out=(torch.empty((2, 8), dtype=torch.int32, device="cuda"),
                                torch.empty((2, 8), dtype=torch.bfloat16, device="cuda")))
    got = indexer.score_topk(*dev, 8, return_scores=True)
    testing.check_topk(p, host(got[0]), host(got[1]), tol=testing.TOL_FAST)


def test_the_pytorch_operator_takes_a_bfloat16_query_in_a_compiled_graph():
    """A bf16 model's layer: the query straight from a bfloat16 projection into the operator,
    under torch.compile (one graph) and eagerly; both as the float32 widening scores."""
    torch = pytest.importorskip("torch")
    iops = pytest.importorskip("indexer.torch_ops")
    p = testing.random_problem(np.random.default_rng(13), T=3, H=64, D=128, E=64, lens=[6000, 0, 900], top_k=64)
    q16, q32 = narrowed(p.q, "bfloat16")
    rest = on_gpu(p.arrays()[1:], q16)

    def layer(q, *pool_and_tables):
        return iops.score_topk(q, *pool_and_tables, 64)

    want = [host(x) for x in layer(on_gpu([q32], q16)[0], *rest)]
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    for got in (layer(q16, *rest), compiled(q16, *rest)):
        assert_same([host(x) for x in got], want)
