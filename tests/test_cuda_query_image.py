"""The single-query wgmma kernel's query as one bulk copy of the image wgmma_prep_kernel
writes (kernels/score_wgmma.cu: PrepToWgmmaImage) against the same kernel reading
prep_query_kernel's staged rows (score_wgmma_kernel<D, true>): the same scores bit for bit,
and the reference's top-k, at every head dim the kernel takes, with fewer heads than 64
(zero weights past H), and on schedules where a CTA scores several segments (its query
image's barrier then completes one phase a segment) and where each CTA scores one row's
run of tiles (more rows than the balanced schedule holds)."""

import numpy as np
import pytest

import indexer
from indexer import arrays, geometry, testing
from tests.gpu import requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


def problem(kind, D, H, rng):
    if kind == "few rows":  # lengths off tile and block edges, an empty row, a row of one entry
        return testing.random_problem(rng, T=5, H=H, D=D, E=64, lens=[20_000, 129, 0, 1, 13_001], top_k=64)
    if kind == "many short rows":  # ~3 tiles a CTA over 2-3 rows: several segments (restarts) a CTA
        return testing.random_problem(rng, T=600, H=H, D=D, E=64, lens=rng.integers(1, 400, size=600), top_k=16)
    assert kind == "per-row schedule"  # more rows than one balanced wave holds
    T = geometry.MAX_BALANCED_ROWS + 40
    return testing.random_problem(rng, T=T, H=H, D=D, E=64, lens=rng.integers(0, 300, size=T), top_k=8)


def scores_of(cuda_ops, p, args, image, monkeypatch):
    """(the run's score rows, each cut at its length; the top-k indices and scores) with the
    query taken as images (image) or as staged rows."""
    monkeypatch.setattr(cuda_ops, "_QUERY_IMAGE", image)
    cuda_ops.clear_plans()
    ws = indexer.Workspace()
    cuda_ops.score_topk(*args, p.top_k, workspace=ws, _fast_kernel="wgmma-single", _score_only=True)
    arrays.cupy().cuda.get_current_stream().synchronize()
    (plan,) = cuda_ops._PLANS.values()
    assert plan.kind == "wgmma" and plan.wgmma_image == image and len(plan.runs) == 1
    assert plan.sl.balanced == (p.q.shape[0] <= geometry.MAX_BALANCED_ROWS)
    views = cuda_ops._run_views(plan, cuda_ops._carve(cuda_ops._part_sizes(plan, False), ws))
    assert (views.qimg is not None) == image and (views.q16 is not None) == (not image)
    rows = views.scores.get()
    got = [rows[t, : int(n)].copy() for t, n in enumerate(p.valid_lens)]
    cuda_ops.clear_plans()
    top = cuda_ops.score_topk(*args, p.top_k, return_scores=True, _fast_kernel="wgmma-single")
    return got, (top[0].get(), top[1].get())


@pytest.mark.parametrize("kind", ["few rows", "many short rows", "per-row schedule"])
@pytest.mark.parametrize("D,H", [(128, 64), (128, 40), (96, 64), (64, 64), (32, 17)])
def test_query_image_scores_match_staged_rows(kind, D, H, monkeypatch):
    from indexer import cuda_ops

    if kind != "few rows" and (D, H) not in ((128, 64), (32, 17)):
        pytest.skip("the schedules at two shapes")
    cp = arrays.cupy()
    rng = np.random.default_rng(D + H + len(kind))
    p = problem(kind, D, H, rng)
    args = [cp.asarray(a) for a in p.arrays()]
    try:
        staged, top_staged = scores_of(cuda_ops, p, args, False, monkeypatch)
        image, top_image = scores_of(cuda_ops, p, args, True, monkeypatch)
    finally:
        monkeypatch.undo()
        cuda_ops.clear_plans()
    assert sum(r.size for r in image) > 1000
    for a, b in zip(staged, image):
        assert a.tobytes() == b.tobytes()
    np.testing.assert_array_equal(top_image[0], top_staged[0])
    assert top_image[1].tobytes() == top_staged[1].tobytes()
    testing.check_topk(p, top_image[0], top_image[1], tol=testing.TOL_FAST)
