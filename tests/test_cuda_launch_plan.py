"""Launch plans cached by call shape (indexer/cuda_ops.py: _plan): a plan is reused only by
calls whose shapes and choices it was made for; a call whose arrays pick another kernel
gets its own plan, and every call's answer is the reference's."""

import numpy as np
import pytest

from indexer import arrays, geometry, testing
from tests.gpu import requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


def test_plans_are_reused_by_shape_and_kept_apart_by_what_picks_the_kernel():
    from indexer import cuda_ops

    cp = arrays.cupy()
    rng = np.random.default_rng(2026)
    p = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=[5000], top_k=256)
    args = [cp.asarray(a) for a in p.arrays()]
    cuda_ops.clear_plans()
    first = cuda_ops.score_topk(*args, p.top_k, return_scores=True)
    again = cuda_ops.score_topk(*args, p.top_k, return_scores=True)
    assert len(cuda_ops._PLANS) == 1  # the second call reused the first call's plan
    np.testing.assert_array_equal(first[0].get(), again[0].get())
    assert first[1].get().tobytes() == again[1].get().tobytes()
    testing.check_topk(p, first[0].get(), first[1].get(), tol=testing.TOL_FAST)

    # the same shapes with q off 16-byte alignment: the warp-specialised kernel cannot stage
    # it, so the call takes another kernel through another plan
    q = args[0]
    shifted = cp.empty(q.size + 1, dtype=q.dtype)[1:].reshape(q.shape)
    shifted[...] = q
    off = cuda_ops.score_topk(shifted, *args[1:], p.top_k, return_scores=True)
    assert len(cuda_ops._PLANS) == 2
    assert sorted(plan.kind for plan in cuda_ops._PLANS.values()) == ["wgmma", "ws"]
    testing.check_topk(p, off[0].get(), off[1].get(), tol=testing.TOL_FAST)

    # another k: another plan, and the first one still serves its own shape
    smaller = cuda_ops.score_topk(*args, 100, return_scores=True)
    assert len(cuda_ops._PLANS) == 3
    np.testing.assert_array_equal(smaller[0].get(), first[0].get()[:, :100])
    np.testing.assert_array_equal(cuda_ops.score_topk(*args, p.top_k).get(), first[0].get())
    assert len(cuda_ops._PLANS) == 3


def test_a_call_whose_forced_kernel_refuses_its_arrays_caches_no_plan():
    from indexer import cuda_ops

    cp = arrays.cupy()
    rng = np.random.default_rng(7)
    p = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=[3000], top_k=64)
    args = [cp.asarray(a) for a in p.arrays()]
    q = args[0]
    shifted = cp.empty(q.size + 1, dtype=q.dtype)[1:].reshape(q.shape)
    shifted[...] = q
    cuda_ops.clear_plans()
    for _ in range(2):  # raised each time, not served from a cache
        with pytest.raises(ValueError, match="^q: expected a 16-byte aligned"):
            cuda_ops.score_topk(shifted, *args[1:], p.top_k, _fast_kernel="ws")
    assert len(cuda_ops._PLANS) == 0


def test_workspace_views_are_cut_once_and_again_after_the_buffer_grows():
    import indexer
    from indexer import cuda_ops

    cp = arrays.cupy()
    rng = np.random.default_rng(11)
    small = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=[2000], top_k=128)
    large = testing.random_problem(rng, T=4, H=64, D=128, E=64, lens=[60000, 3, 40000, 65536], top_k=512)
    small_args = [cp.asarray(a) for a in small.arrays()]
    large_args = [cp.asarray(a) for a in large.arrays()]
    ws = indexer.Workspace()
    cuda_ops.clear_plans()
    first = cuda_ops.score_topk(*small_args, small.top_k, return_scores=True, workspace=ws)
    views = dict(ws._views)
    assert len(views) == 1
    again = cuda_ops.score_topk(*small_args, small.top_k, return_scores=True, workspace=ws)
    assert ws._views == views  # the same views, not cut again
    held = ws.nbytes
    big = cuda_ops.score_topk(*large_args, large.top_k, return_scores=True, workspace=ws)
    assert ws.nbytes > held  # the buffer grew: the small call's views went with the old one
    assert not any(key in views for key in ws._views)  # only the large call's views now
    after = cuda_ops.score_topk(*small_args, small.top_k, return_scores=True, workspace=ws)
    assert len(ws._views) == 2
    for got in (again, after):
        np.testing.assert_array_equal(first[0].get(), got[0].get())
        assert first[1].get().tobytes() == got[1].get().tobytes()
    testing.check_topk(small, first[0].get(), first[1].get(), tol=testing.TOL_FAST)
    testing.check_topk(large, big[0].get(), big[1].get(), tol=testing.TOL_FAST)



def test_views_of_many_call_shapes_stay_bounded_and_hold_no_memory(monkeypatch):
    import indexer
    from indexer import cuda_ops
    from indexer import workspace as workspace_module

    cp = arrays.cupy()
    monkeypatch.setattr(workspace_module, "_MAX_VIEWS", 5)
    rng = np.random.default_rng(12)
    p = testing.random_problem(rng, T=2, H=64, D=128, E=64, lens=[9000, 4100], top_k=64)
    args = [cp.asarray(a) for a in p.arrays()]
    ks = [16, 40, 64, 100, 128, 200, 256, 300]  # a plan and a set of views each
    expected = {k: cuda_ops.score_topk(*args, k).get() for k in ks}  # no workspace: views cut per call
    exact = testing.exact_scores(p)
    for k in ks:  # right, not only the same with and without a workspace
        p.top_k = k
        testing.check_topk(p, expected[k], tol=testing.TOL_FAST, exact=exact)
    ws = indexer.Workspace()
    cuda_ops.clear_plans()
    pool = cp.get_default_memory_pool()
    used = []
    for _ in range(3):
        for k in ks:
            got = cuda_ops.score_topk(*args, k, workspace=ws)
            np.testing.assert_array_equal(got.get(), expected[k])
            del got
            assert 1 <= len(ws._views) <= 5
        cp.cuda.Device().synchronize()
        used.append(pool.used_bytes())
    assert used[1] == used[2]  # nothing kept past what the first round held


def _part_ranges(views, names):
    """(name, first byte, end byte) of every non-empty typed array among ``names``."""
    out = []
    for name in names:
        x = getattr(views, name)
        if x is not None:
            out.append((name, x.data.ptr, x.data.ptr + x.nbytes))
    return out


def test_run_views_are_typed_aligned_and_disjoint_parts_of_one_allocation():
    """Every plan's scratch arrays (``_carve`` + ``_run_views``, with and without a
    workspace) lie 256-byte aligned inside one allocation, none overlapping another, with
    the dtypes and shapes the launches take."""
    import indexer
    from indexer import cuda_ops

    cp = arrays.cupy()
    rng = np.random.default_rng(31)
    cuda_ops.clear_plans()
    # calls that make plans of every scoring kernel and select
    one = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=[70000], top_k=1024)
    mixed = testing.random_problem(rng, T=5, H=64, D=128, E=64, lens=[40000, 0, 900, 12345, 65536], top_k=300)
    short = testing.random_problem(rng, T=6, H=16, D=64, E=16, lens=None, top_k=20)
    seq = testing.random_problem(rng, T=8, H=64, D=128, E=64, lens=[9000] * 8, top_k=128, shared_blocks=True)
    cu = cp.asarray(np.array([0, 3, 8], dtype=np.int32))
    calls = [(one, {}), (mixed, {}), (mixed, {"precision": "exact"}), (short, {}),
             (seq, {"_cu_seqlens": cu}), (seq, {"_cu_seqlens": cu, "_fast_kernel": "ks", "_select": "sampled"}),
             (seq, {"_cu_seqlens": cu, "_fast_kernel": "dense"}), (seq, {"_cu_seqlens": cu, "_fast_kernel": "pairs"})]
    for p, kw in calls:
        args = [cp.asarray(a) for a in p.arrays()]
        got = cuda_ops.score_topk(*args, p.top_k, return_scores=True, **kw)
        testing.check_topk(p, got[0].get(), got[1].get(),
                           tol=testing.TOL_EXACT if kw.get("precision") == "exact" else testing.TOL_FAST)
    plans = list(cuda_ops._PLANS.values())
    assert {pl.kind for pl in plans} >= {"ws", "fp32", "ks", "dense", "pairs"}
    assert any(pl.row_select for pl in plans) and any(pl.sampled_ok for pl in plans)
    names = ("scores", "hist", "count", "cand", "tau", "q16", "w_scaled", "qimg", "kimg")
    dtypes = {"scores": np.float32, "hist": np.uint32, "count": np.uint32, "cand": np.uint64, "tau": np.uint32,
              "q16": np.uint16, "w_scaled": np.float32, "qimg": np.uint8, "kimg": np.uint8}
    ws = indexer.Workspace()
    for pl in plans:
        sizes = cuda_ops._part_sizes(pl, False)
        for workspace in (None, ws):
            parts = cuda_ops._carve(sizes, workspace)
            base = parts[0].ptr
            total = sum(-(-n // 256) * 256 for n in sizes.values())
            v = cuda_ops._run_views(pl, parts)
            ranges = _part_ranges(v, names)
            assert {name for name, _, _ in ranges} == {name for name, n in sizes.items() if n}
            for name, lo, hi in ranges:
                x = getattr(v, name)
                assert x.dtype == dtypes[name] and x.flags.c_contiguous
                assert x.nbytes == sizes[name] and (lo - base) % 256 == 0 and base <= lo < hi <= base + total
            ranges.sort(key=lambda r: r[1])
            assert all(a[2] <= b[1] for a, b in zip(ranges, ranges[1:]))  # no two parts overlap
            assert v.scores.shape == (pl.rows, pl.sl.ld)
            if pl.heads:
                assert v.q16.shape == (pl.rows, pl.heads, pl.D + 8) and v.w_scaled.shape == (pl.rows, pl.heads)
            # the wgmma kernels' query images (bulk copies a segment or piece), no staged rows
            assert pl.wgmma_image == (pl.kind in ("wgmma", "pairs"))
            if pl.wgmma_image:
                assert not pl.heads and v.qimg.size == pl.rows * geometry.wgmma_query_image_bytes(pl.D)


def test_zero_clears_exactly_the_array_it_is_given():
    from indexer import cuda_ops

    cp = arrays.cupy()
    whole = cp.asarray(np.random.default_rng(5).integers(1, 2**32, size=4099, dtype=np.uint32))
    before = whole.get()
    part = whole[7:4000]  # an offset view: its neighbours must keep their values
    cuda_ops._zero(part)
    after = whole.get()
    assert not after[7:4000].any()
    np.testing.assert_array_equal(after[:7], before[:7])
    np.testing.assert_array_equal(after[4000:], before[4000:])
