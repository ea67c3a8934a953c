"""The tensor-core scoring kernels (mma.sync, Hopper's wgmma, and the warp-specialised
wgmma kernel 'ws') against the reference, forced one at a time: the public API picks a
Hopper kernel where one applies, mma.sync elsewhere."""

import numpy as np
import pytest

from indexer import arrays, geometry, testing
from tests.gpu import requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


def kernels():
    if not arrays.gpu_supported():
        return ["mma"]
    from indexer import cuda_ops

    cp = arrays.cupy()
    dev = cuda_ops.device_facts(cp.cuda.Device().id)
    return ["mma", "wgmma", "ws"] if geometry.ws_supported(64, 128, dev) else ["mma"]


def supported(kernel, H, D, E):
    """Whether a forced kernel takes this shape (on the H200)."""
    if kernel == "wgmma":
        return geometry.wgmma_supported(H, D, geometry.H200, E)
    if kernel == "ws":
        return geometry.ws_supported(H, D, geometry.H200, E)
    return True


def run(p, kernel, **kw):
    from indexer import cuda_ops

    cp = arrays.cupy()
    idx, sc = cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, precision="fast",
                                  return_scores=True, _fast_kernel=kernel, **kw)
    return idx.get(), sc.get()


@pytest.mark.parametrize("kernel", kernels())
@pytest.mark.parametrize("H,D,E,top_k,T,lens", [
    (64, 128, 64, 512, 3, 5000),
    (64, 128, 16, 100, 4, None),
    (7, 32, 16, 9, 3, None),
    (33, 64, 32, 64, 2, 1000),
    (64, 96, 256, 300, 2, 700),
    (16, 128, 17, 50, 3, 600),   # E not a power of two
    # small blocks: rows r and r + 8 of a tile in different blocks (their own global
    # scales), and the wgmma ring's copies more than one a warp (32 a warp at E = 2)
    (64, 128, 4, 64, 3, 700),
    (64, 128, 2, 40, 2, 400),
    (8, 32, 8, 20, 3, 300),
])
def test_random(kernel, H, D, E, top_k, T, lens):
    rng = np.random.default_rng(H * 1000 + D + E)
    p = testing.random_problem(rng, T=T, H=H, D=D, E=E, lens=lens, L=None if lens else 5, top_k=top_k)
    if not supported(kernel, H, D, E):
        # the wgmma kernels copy whole block runs (and 'ws' takes D = 128 only): a forced
        # call says why, auto falls back
        with pytest.raises(ValueError, match="power-of-two E"):
            run(p, kernel)
        kernel = "auto"
    idx, sc = run(p, kernel)
    testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)


@pytest.mark.parametrize("kernel", kernels())
@pytest.mark.parametrize("T,E,max_len,seed", [
    (1, 64, 65_536, 0),       # one long row spread over every CTA
    (37, 64, 9_000, 1),       # ragged: lengths 0 .. 9,000, zeros and off-edge lengths included
    (300, 2, 700, 2),         # many short rows, 2-entry blocks (16-byte scale runs)
    (5, 256, 3_000, 3),       # blocks longer than a tile
    (1025, 128, 400, 4),      # past MAX_BALANCED_ROWS: runs of tiles per row
])
def test_ragged_batches_and_schedules(kernel, T, E, max_len, seed):
    rng = np.random.default_rng(100 + seed)
    lens = rng.integers(0, max_len + 1, size=T)
    lens[rng.random(T) < 0.2] = 0
    lens[0] = max_len
    if T > 2:
        lens[1] = 1
        lens[2] = 129
    top_k = 64 if T > 100 else 300
    p = testing.random_problem(rng, T=T, H=64, D=128, E=E, lens=lens, top_k=top_k, gscale_spread=2.0)
    idx, sc = run(p, kernel)
    testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)


@pytest.mark.parametrize("kernel", kernels())
def test_a_long_run_of_tiles_per_cta(kernel):
    """Past MAX_BALANCED_ROWS rows a long row is cut into runs of a few hundred tiles a
    CTA (~365 at three CTAs an SM), each CTA's histogram counts summed into the row's: a
    lost or doubled count would move the select's thresholds. 256 tiles is where a packed
    16-bit count (the pair kernel's; a single-query form measured in docs/performance.md
    v64) would have to be flushed."""
    rng = np.random.default_rng(77)
    T = geometry.MAX_BALANCED_ROWS + 1
    lens = rng.integers(0, 400, size=T)
    lens[0] = 140_000
    # 512 pool blocks under 2,188 logical ones: row 0 repeats keys, so its top 64 are ties
    p = testing.random_problem(rng, T=T, H=64, D=128, E=64, lens=lens, top_k=64, P=512, gscale_spread=2.0)
    idx, sc = run(p, kernel)
    testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)


def test_wgmma_falls_back_when_scales_are_not_16_byte_aligned():
    from indexer import cuda_ops

    if "wgmma" not in kernels():
        pytest.skip("no Hopper GPU")
    cp = arrays.cupy()
    rng = np.random.default_rng(7)
    p = testing.random_problem(rng, T=3, H=64, D=128, E=64, lens=2000, top_k=50)
    args = [cp.asarray(a) for a in p.arrays()]
    # the same scales 8 bytes into a bigger buffer: 8-byte aligned, not 16
    buf = cp.zeros(args[3].size + 8, dtype=cp.uint8)
    buf[8:] = args[3].ravel()
    args[3] = buf[8:].reshape(args[3].shape)
    assert args[3].data.ptr % 16 == 8
    with pytest.raises(ValueError, match="key_scale.*16-byte"):
        cuda_ops.score_topk(*args, p.top_k, _fast_kernel="wgmma")
    idx, sc = cuda_ops.score_topk(*args, p.top_k, return_scores=True)  # auto: mma.sync
    testing.check_topk(p, idx.get(), sc.get(), tol=testing.TOL_FAST)


def test_forced_kernel_names_are_checked():
    # a name _scoring_kernel does not know raised nothing and took mma.sync; 'pairs' is
    # forced by its own name, for rows of sequences only
    from indexer import cuda_ops

    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(8), T=2, H=64, D=128, E=64, lens=300, top_k=8, shared_blocks=True)
    args = [cp.asarray(a) for a in p.arrays()]
    with pytest.raises(ValueError, match="fast_kernel: expected one of .*'pairs'.*got 'pair'"):
        cuda_ops.score_topk(*args, p.top_k, _fast_kernel="pair")
    if "wgmma" in kernels():
        with pytest.raises(ValueError, match="fast_kernel: 'pairs' scores the rows of sequences"):
            cuda_ops.score_topk(*args, p.top_k, _fast_kernel="pairs")
        cuda_ops.clear_plans()
        cu = cp.asarray(np.array([0, 2], dtype=np.int32))
        idx, sc = cuda_ops.score_topk(*args, p.top_k, return_scores=True, _fast_kernel="pairs", _cu_seqlens=cu)
        assert [pl.kind for pl in cuda_ops._PLANS.values()] == ["pairs"]
        cuda_ops.clear_plans()
        testing.check_topk(p, idx.get(), sc.get(), tol=testing.TOL_FAST)


def _offset_view(cp, x, elements):
    """x's values in a fresh buffer, `elements` float32 elements past its start: a contiguous
    view off 16-byte alignment."""
    buf = cp.empty(x.size + elements, dtype=x.dtype)
    view = buf[elements:].reshape(x.shape)
    view[...] = x
    return view


def test_a_query_off_16_byte_alignment_takes_a_kernel_that_reads_it():
    # the warp-specialised and pair kernels load the fp32 query 16 bytes at a time; a view 4
    # bytes off that alignment must not reach them (auto picks the staging kernel's path, a
    # forced 'ws' says why)
    from indexer import cuda_ops

    if "ws" not in kernels():
        pytest.skip("no Hopper GPU")
    cp = arrays.cupy()
    rng = np.random.default_rng(8)
    p = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=20_000, top_k=256)  # batch 1: 'ws' by default
    args = [cp.asarray(a) for a in p.arrays()]
    args[0] = _offset_view(cp, args[0], 1)
    assert args[0].data.ptr % 16 == 4
    with pytest.raises(ValueError, match="q.*16-byte"):
        cuda_ops.score_topk(*args, p.top_k, _fast_kernel="ws")
    idx, sc = cuda_ops.score_topk(*args, p.top_k, return_scores=True)
    testing.check_topk(p, idx.get(), sc.get(), tol=testing.TOL_FAST)
    # rows of one sequence (the pair kernel's calls): the same bits as the aligned query's
    T = 6
    p = testing.random_problem(rng, T=T, H=64, D=128, E=64, lens=3000, top_k=64, shared_blocks=True)
    args = [cp.asarray(a) for a in p.arrays()]
    cu = cp.asarray(np.array([0, T], dtype=np.int32))
    aligned = cuda_ops.score_topk(*args, p.top_k, return_scores=True, _cu_seqlens=cu)
    args[0] = _offset_view(cp, args[0], 1)
    offset = cuda_ops.score_topk(*args, p.top_k, return_scores=True, _cu_seqlens=cu)
    np.testing.assert_array_equal(offset[0].get(), aligned[0].get())
    assert offset[1].get().tobytes() == aligned[1].get().tobytes()


@pytest.mark.parametrize("kernel", kernels())
@pytest.mark.parametrize("kind", testing.ADVERSARIAL_KINDS)
def test_adversarial(kernel, kind):
    rng = np.random.default_rng(31)
    p = testing.adversarial_problem(kind, rng, H=64, D=128, E=64)
    idx, sc = run(p, kernel)
    testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)


@pytest.mark.parametrize("kernel", kernels())
def test_bit_identical_reruns_that_meet_the_reference(kernel):
    rng = np.random.default_rng(32)
    p = testing.random_problem(rng, T=6, H=64, D=128, E=64, lens=8000, top_k=256)
    first = run(p, kernel)
    again = run(p, kernel)
    np.testing.assert_array_equal(first[0], again[0])
    assert first[1].tobytes() == again[1].tobytes()
    testing.check_topk(p, first[0], first[1], tol=testing.TOL_FAST)  # deterministic and right
