"""The wgmma kernels' queries as bulk copies of the images wgmma_prep_kernel writes
(kernels/score_wgmma.cu: PrepToWgmmaImage) against the same kernels staging them the other
way (score_wgmma_kernel<D, true>: prep_query_kernel's rows by 16-byte copies;
score_wgmma_pairs_kernel<D, true>: from the fp32 query, in the kernel): the same scores bit
for bit, and the reference's top-k, at every head dim the kernels take, with fewer heads than
64 (zero weights past H), on schedules where a CTA scores several segments or pieces (the
images' barrier then completes one phase each), where each CTA scores one row's run of tiles
(more rows than the balanced schedule holds), and, for the pair kernel, on rows that share a
sequence, lone rows and pairs that straddle two sequences (each row a piece of its own)."""

import numpy as np
import pytest

import indexer
from indexer import arrays, geometry, testing
from tests.gpu import requires_gpu
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]


def single_problem(kind, D, H, rng):
    if kind == "few rows":  # lengths off tile and block edges, an empty row, a row of one entry
        return testing.random_problem(rng, T=5, H=H, D=D, E=64, lens=[20_000, 129, 0, 1, 13_001], top_k=64)
    if kind == "many short rows":  # ~3 tiles a CTA over 2-3 rows: several segments (restarts) a CTA
        return testing.random_problem(rng, T=600, H=H, D=D, E=64, lens=rng.integers(1, 400, size=600), top_k=16)
    assert kind == "per-row schedule"  # more rows than one balanced wave holds
    T = geometry.MAX_BALANCED_ROWS + 40
    return testing.random_problem(rng, T=T, H=H, D=D, E=64, lens=rng.integers(0, 300, size=T), top_k=8)


def pairs_problem(kind, D, H, rng):
    """(problem, cu_seqlens) of rows grouped into sequences."""
    if kind == "few rows":  # two pairs that share; a pair across two sequences (1 | 1); the odd last row alone
        counts, entries = [2, 2, 1, 1, 2, 1], [20_000, 9_001, 700, 129, 13_000, 5_000]
    else:  # many short sequences: several pieces (restarts) a CTA
        assert kind == "many short rows"
        counts = [2] * 150 + [1, 3]
        entries = [int(x) for x in rng.integers(1, 3_000, size=len(counts))]
    q, w, k, s, g, table, cu, lens = grouped_problem(rng, counts, H=H, D=D, E=64, seq_entries=entries, top_k=32)
    return as_problem(q, w, k, s, g, table, cu, lens, 32), cu


def scores_of(cuda_ops, p, args, image, monkeypatch, **kw):
    """(the run's score rows, each cut at its length; the top-k indices and scores) with the
    queries taken as images (image) or staged the other way."""
    monkeypatch.setattr(cuda_ops, "_QUERY_IMAGE", image)
    cuda_ops.clear_plans()
    ws = indexer.Workspace()
    cuda_ops.score_topk(*args, p.top_k, workspace=ws, _score_only=True, **kw)
    arrays.cupy().cuda.get_current_stream().synchronize()
    (plan,) = cuda_ops._PLANS.values()
    assert plan.wgmma_image == image and len(plan.runs) == 1
    views = cuda_ops._run_views(plan, cuda_ops._carve(cuda_ops._part_sizes(plan, False), ws))
    assert (views.qimg is not None) == image
    rows = views.scores.get()
    got = [rows[t, : int(n)].copy() for t, n in enumerate(p.valid_lens)]
    cuda_ops.clear_plans()
    top = cuda_ops.score_topk(*args, p.top_k, return_scores=True, **kw)
    return plan, got, (top[0].get(), top[1].get())


def check_same(cuda_ops, p, args, monkeypatch, kind_wanted, **kw):
    try:
        plan, staged, top_staged = scores_of(cuda_ops, p, args, False, monkeypatch, **kw)
        _, image, top_image = scores_of(cuda_ops, p, args, True, monkeypatch, **kw)
    finally:
        monkeypatch.undo()
        cuda_ops.clear_plans()
    assert plan.kind == kind_wanted
    assert sum(r.size for r in image) > 1000
    for a, b in zip(staged, image):
        assert a.tobytes() == b.tobytes()
    np.testing.assert_array_equal(top_image[0], top_staged[0])
    assert top_image[1].tobytes() == top_staged[1].tobytes()
    testing.check_topk(p, top_image[0], top_image[1], tol=testing.TOL_FAST)
    return plan


SHAPES = [(128, 64), (128, 40), (96, 64), (64, 64), (32, 17)]


@pytest.mark.parametrize("kind", ["few rows", "many short rows", "per-row schedule"])
@pytest.mark.parametrize("D,H", SHAPES)
def test_single_query_image_scores_match_staged_rows(kind, D, H, monkeypatch):
    from indexer import cuda_ops

    if kind != "few rows" and (D, H) not in ((128, 64), (32, 17)):
        pytest.skip("the schedules at two shapes")
    cp = arrays.cupy()
    p = single_problem(kind, D, H, np.random.default_rng(D + H + len(kind)))
    args = [cp.asarray(a) for a in p.arrays()]
    plan = check_same(cuda_ops, p, args, monkeypatch, "wgmma", _fast_kernel="wgmma-single")
    assert plan.sl.balanced == (p.q.shape[0] <= geometry.MAX_BALANCED_ROWS)


@pytest.mark.parametrize("kind", ["few rows", "many short rows"])
@pytest.mark.parametrize("D,H", SHAPES)
def test_pair_images_scores_match_staging_in_the_kernel(kind, D, H, monkeypatch):
    from indexer import cuda_ops

    if kind != "few rows" and (D, H) not in ((128, 64), (32, 17)):
        pytest.skip("the schedules at two shapes")
    cp = arrays.cupy()
    p, cu = pairs_problem(kind, D, H, np.random.default_rng(3 * D + H + len(kind)))
    args = [cp.asarray(a) for a in p.arrays()]
    check_same(cuda_ops, p, args, monkeypatch, "pairs", _fast_kernel="pairs", _cu_seqlens=cp.asarray(cu))
