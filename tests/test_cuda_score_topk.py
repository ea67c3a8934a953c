"""The CUDA paths against the float64 reference: 'exact' within 1e-6 of each score's
magnitude, 'fast' (tensor cores) within 2**-11."""

import numpy as np
import pytest

from indexer import arrays, reference, score_topk, testing
from tests.gpu import requires_gpu, side_stream

pytestmark = [requires_gpu, pytest.mark.gpu]


TOL = {"exact": testing.TOL_EXACT, "fast": testing.TOL_FAST}
PRECISIONS = pytest.mark.parametrize("precision", ["exact", "fast"])


def run_cuda(p, precision="exact", **kw):
    cp = arrays.cupy()
    dev = [cp.asarray(a) for a in p.arrays()]
    out = score_topk(*dev, p.top_k, backend="cuda", precision=precision, return_scores=True, **kw)
    return out[0].get(), out[1].get()


@pytest.mark.parametrize("H,D,E,top_k,T", [
    (1, 32, 16, 1, 3),
    (5, 64, 16, 7, 4),
    (8, 128, 64, 100, 3),
    (16, 64, 32, 64, 5),
    (33, 96, 64, 200, 2),
    (64, 128, 64, 512, 3),
    (64, 256, 256, 1024, 2),
    (128, 64, 16, 50, 2),
    (64, 128, 16, 4096, 2),
])
@PRECISIONS
def test_random_matches_reference(H, D, E, top_k, T, precision):
    rng = np.random.default_rng(1000 + H + D + E + top_k)
    p = testing.random_problem(rng, T=T, H=H, D=D, E=E, L=max(2, -(-3 * top_k // E) // 2), top_k=top_k)
    idx, sc = run_cuda(p, precision)
    testing.check_topk(p, idx, sc, tol=TOL[precision])


@pytest.mark.parametrize("D", [32, 96, 160, 224])
def test_fast_path_every_head_dim_layout(D):
    # D/8 bytes per thread and row: 4, 12, 20, 28 -> every load width and scale-group split
    rng = np.random.default_rng(D)
    p = testing.random_problem(rng, T=3, H=24, D=D, E=16, L=6, top_k=30)
    idx, sc = run_cuda(p, "fast")
    testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)


@pytest.mark.parametrize("kind", testing.ADVERSARIAL_KINDS)
@pytest.mark.parametrize("H,D,E", [(8, 64, 16), (64, 128, 64)])
@PRECISIONS
def test_adversarial_matches_reference(kind, H, D, E, precision):
    rng = np.random.default_rng(7)
    p = testing.adversarial_problem(kind, rng, H=H, D=D, E=E)
    idx, sc = run_cuda(p, precision)
    testing.check_topk(p, idx, sc, tol=TOL[precision])


@PRECISIONS
def test_long_row_split_over_ctas_and_large_k(precision):
    # one query, many entries: the scoring spreads over many CTAs, the select sees 40k entries
    rng = np.random.default_rng(11)
    p = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=40_000, top_k=4096)
    idx, sc = run_cuda(p, precision)
    testing.check_topk(p, idx, sc, tol=TOL[precision])


@PRECISIONS
def test_physical_indices_match_reference(precision):
    rng = np.random.default_rng(12)
    p = testing.random_problem(rng, T=4, H=16, D=64, E=32, L=5, top_k=40)
    cp = arrays.cupy()
    got = score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, backend="cuda", precision=precision,
                     physical=True).get()
    logical = run_cuda(p, precision)[0]
    np.testing.assert_array_equal(got, reference.to_physical(logical, p.block_table, p.keys_fp4.shape[1]))
    testing.check_topk(p, got, tol=TOL[precision], physical=True)


@PRECISIONS
def test_bit_identical_reruns(precision):
    rng = np.random.default_rng(13)
    p = testing.random_problem(rng, T=8, H=64, D=128, E=64, lens=5000, top_k=512)
    first = run_cuda(p, precision)
    for _ in range(3):
        again = run_cuda(p, precision)
        np.testing.assert_array_equal(first[0], again[0])
        assert first[1].tobytes() == again[1].tobytes()


def test_numpy_in_numpy_out_and_cupy_in_cupy_out():
    cp = arrays.cupy()
    rng = np.random.default_rng(14)
    p = testing.random_problem(rng, T=2, H=8, D=64, E=16, L=3, top_k=10)
    host = score_topk(*p.args(), backend="cuda")
    assert isinstance(host, np.ndarray)
    dev = score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k)  # auto picks CUDA for device arrays
    assert isinstance(dev, cp.ndarray)
    np.testing.assert_array_equal(host, dev.get())


@PRECISIONS
def test_validate_false_never_follows_bad_block_ids(precision):
    # out-of-range ids for visible blocks and lengths past L*E: no fault, those entries skipped
    cp = arrays.cupy()
    rng = np.random.default_rng(15)
    p = testing.random_problem(rng, T=3, H=8, D=64, E=16, lens=48, L=3, top_k=64)
    bt = p.block_table.copy()
    bt[0, 1] = 10**6
    bt[1, 0] = -7
    lens = p.valid_lens.copy()
    lens[2] = 10**6
    args = [cp.asarray(a) for a in (p.q, p.w, p.keys_fp4, p.key_scale, p.key_gscale, bt, lens)]
    idx = score_topk(*args, p.top_k, backend="cuda", precision=precision, validate=False).get()
    cp.cuda.Device().synchronize()
    E = p.keys_fp4.shape[1]
    assert not np.any((idx[0] >= E) & (idx[0] < 2 * E))  # the bad block's entries never chosen
    assert not np.any((idx[1] >= 0) & (idx[1] < E))
    assert idx[2].max() < 3 * E  # clamped to L * E
    with pytest.raises(ValueError, match="valid_lens"):
        score_topk(*args, p.top_k, backend="cuda")
    args[-1] = cp.asarray(p.valid_lens)
    with pytest.raises(ValueError, match="block_table"):
        score_topk(*args, p.top_k, backend="cuda")


def test_nvfp4_codec_on_device_equals_host():
    from indexer import nvfp4

    cp = arrays.cupy()
    rng = np.random.default_rng(16)
    x = (rng.standard_normal((64, 128)) * np.exp2(rng.uniform(-20, 20, size=(64, 1)))).astype(np.float32)
    c_h, s_h, g_h = nvfp4.quantize(x)
    c_d, s_d, g_d = nvfp4.quantize(cp.asarray(x))
    assert isinstance(c_d, cp.ndarray)
    np.testing.assert_array_equal(c_h, c_d.get())
    np.testing.assert_array_equal(s_h, s_d.get())
    assert float(g_h) == float(g_d)
    y_h = nvfp4.dequantize(c_h, s_h, g_h)
    y_d = nvfp4.dequantize(c_d, s_d, g_d)
    assert y_h.tobytes() == y_d.get().tobytes()


@PRECISIONS
def test_candidate_buffer_overflow_falls_back_exactly(precision):
    # Every score is exactly 0 (keys >= 0, queries < 0, weights > 0): the threshold bin holds
    # every entry of a row. 20,000 and 9,000 are more than the candidate buffer (8192) takes:
    # the select must notice and fall back to the full-row radix select; 6,000 candidates
    # are sorted by one CTA (more than the rank kernel takes, 4,096); 3,000 and 300 are
    # ranked. Every route must give the lowest indices.
    rng = np.random.default_rng(17)
    p = testing.random_problem(rng, T=5, H=8, D=64, E=64, lens=[20_000, 9_000, 6_000, 3_000, 300], top_k=100)
    keys = np.abs(rng.standard_normal(p.keys_fp4.shape[:2] + (64,))).astype(np.float32)
    p.keys_fp4, p.key_scale, p.key_gscale = testing.quantize_blocks(keys)
    p.q = -np.abs(p.q) - np.float32(0.1)
    p.w = np.abs(p.w) + np.float32(0.1)
    idx, sc = run_cuda(p, precision)
    np.testing.assert_array_equal(idx, np.tile(np.arange(100, dtype=np.int32), (5, 1)))
    assert np.all(sc == 0)
    testing.check_topk(p, idx, sc, tol=TOL[precision])


@pytest.mark.parametrize("length", [20_000, 4_097, 4_096, 1_500, 300])
def test_all_pairs_rank_takes_plateaus_and_overflow_at_batch_1(length):
    # batch 1 ranks by comparing every pair of candidates: a plateau of exactly-zero scores
    # (every entry a candidate) must still give the lowest indices, whether the candidates
    # fit the rank's 4,096 (4,096 and below), not (4,097: the row's radix select) or
    # overflow the buffer (20,000)
    from indexer import cuda_ops, geometry

    assert geometry.rank_all_pairs(1, 1024)
    cp = arrays.cupy()
    rng = np.random.default_rng(length)
    p = testing.random_problem(rng, T=1, H=8, D=64, E=64, lens=[length], top_k=1024)
    keys = np.abs(rng.standard_normal(p.keys_fp4.shape[:2] + (64,))).astype(np.float32)
    p.keys_fp4, p.key_scale, p.key_gscale = testing.quantize_blocks(keys)
    p.q = -np.abs(p.q) - np.float32(0.1)
    p.w = np.abs(p.w) + np.float32(0.1)
    out = cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, return_scores=True, _select="multi")
    idx, sc = out[0].get(), out[1].get()
    m = min(length, 1024)
    np.testing.assert_array_equal(idx[0, :m], np.arange(m, dtype=np.int32))
    assert np.all(idx[0, m:] == -1)
    testing.check_topk(p, idx, sc, tol=TOL["fast"])


@pytest.mark.parametrize("T,top_k", [(64, 32), (96, 16), (4, 512)])
def test_all_pairs_rank_with_few_ctas_a_row_matches_the_binned_rank(T, top_k, monkeypatch):
    # the all-pairs rank (forced here past the rows it takes by default, as the rank route
    # itself) with as few as one CTA a row (the SMs // T): random rows, rows of a zero plateau
    # (every entry a candidate, past the rank's 4,096 on the longest) and empty rows; the
    # answer is the binned rank's, bit for bit, and the reference's
    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    rng = np.random.default_rng(T + top_k)
    lens = rng.integers(0, 5000, size=T)
    lens[0], lens[-1] = 0, 4500
    p = testing.random_problem(rng, T=T, H=8, D=64, E=64, lens=lens, top_k=top_k)
    keys = np.abs(rng.standard_normal(p.keys_fp4.shape[:2] + (64,))).astype(np.float32)
    p.keys_fp4, p.key_scale, p.key_gscale = testing.quantize_blocks(keys)
    plateau = rng.random(T) < 0.5
    plateau[-1] = True
    p.q[plateau] = -np.abs(p.q[plateau]) - np.float32(0.1)  # every score of the row 0
    p.w[plateau] = np.abs(p.w[plateau]) + np.float32(0.1)
    args = [cp.asarray(a) for a in p.arrays()]
    out = {}
    try:
        monkeypatch.setattr(geometry, "row_stream_select", lambda *a: False)
        monkeypatch.setattr(geometry, "rank_select", lambda *a: True)
        for all_pairs in (True, False):
            monkeypatch.setattr(geometry, "rank_all_pairs", lambda *a, r=all_pairs: r)
            cuda_ops.clear_plans()
            out[all_pairs] = [a.get() for a in cuda_ops.score_topk(*args, p.top_k, return_scores=True,
                                                                  _select="multi")]
    finally:
        monkeypatch.undo()
        cuda_ops.clear_plans()
    np.testing.assert_array_equal(out[True][0], out[False][0])
    assert out[True][1].tobytes() == out[False][1].tobytes()
    for t in np.flatnonzero(plateau):
        m = min(int(lens[t]), top_k)
        np.testing.assert_array_equal(out[True][0][t, :m], np.arange(m, dtype=np.int32))
    testing.check_topk(p, out[True][0], out[True][1], tol=TOL["fast"])


@PRECISIONS
def test_many_rows_and_ragged_lengths(precision):
    rng = np.random.default_rng(18)
    lens = rng.integers(0, 6000, size=40)
    p = testing.random_problem(rng, T=40, H=64, D=128, E=64, lens=lens, top_k=512)
    idx, sc = run_cuda(p, precision)
    testing.check_topk(p, idx, sc, tol=TOL[precision])


def test_pytorch_tensors_in_pytorch_tensors_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(19)
    p = testing.random_problem(rng, T=3, H=16, D=64, E=16, L=4, top_k=20)
    tensors = [torch.from_numpy(a).cuda() for a in p.arrays()]
    idx, sc = score_topk(*tensors, p.top_k, return_scores=True)
    assert isinstance(idx, torch.Tensor) and idx.is_cuda and idx.dtype == torch.int32
    testing.check_topk(p, idx.cpu().numpy(), sc.cpu().numpy(), tol=testing.TOL_FAST)


def test_replay_from_a_cuda_graph_matches_eager():
    cp = arrays.cupy()
    rng = np.random.default_rng(20)
    p = testing.random_problem(rng, T=4, H=64, D=128, E=64, lens=3000, top_k=256)
    dev = [cp.asarray(a) for a in p.arrays()]
    eager = score_topk(*dev, p.top_k, validate=False).get()
    stream = side_stream()
    with stream:
        score_topk(*dev, p.top_k, validate=False)  # the pool now holds every block size the call takes
        stream.synchronize()
        stream.begin_capture()
        out = score_topk(*dev, p.top_k, validate=False)
        graph = stream.end_capture()
        out.fill(-7)
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(out.get(), eager)


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_runs_of_rows_under_a_small_workspace_budget_give_the_same_bits(precision):
    # the workspace is cut into runs of rows that fit the budget: one row per run here
    from indexer import cuda_ops

    cp = arrays.cupy()
    rng = np.random.default_rng(77)
    p = testing.random_problem(rng, T=7, H=64, D=128, E=64, L=6, top_k=40)
    args = [cp.asarray(a) for a in p.arrays()]
    whole = cuda_ops.score_topk(*args, p.top_k, precision=precision, return_scores=True)
    per_row = cuda_ops.score_topk(*args, p.top_k, precision=precision, return_scores=True, workspace_budget=1)
    np.testing.assert_array_equal(whole[0].get(), per_row[0].get())
    assert whole[1].get().tobytes() == per_row[1].get().tobytes()
    testing.check_topk(p, per_row[0].get(), per_row[1].get(),
                       tol=testing.TOL_FAST if precision == "fast" else testing.TOL_EXACT)


@pytest.mark.parametrize("precision", ["fast", "exact"])
@pytest.mark.parametrize("kind", testing.ADVERSARIAL_KINDS + ("random", "random-3k", "random-k2000", "long"))
def test_both_selects_give_the_same_answer(kind, precision):
    # one CTA per row (short rows, the default up to 2,048 entries, and up to ROW_SELECT_MAX_LEN
    # where there are many rows: 128 threads up to 2,048 entries and k <= 1,024, else 256;
    # forced here) and the multi-CTA passes (long rows) see
    # the same scores: identical indices and scores, both meeting the reference's contract,
    # on adversarial rows too
    from indexer import cuda_ops

    cp = arrays.cupy()
    rng = np.random.default_rng(91)
    if kind == "random":
        p = testing.random_problem(rng, T=9, H=64, D=128, E=64, L=8, top_k=100)
    elif kind == "random-3k":  # past SHORT_ROW_SELECT_MAX_LEN: the 256-thread row select
        p = testing.random_problem(rng, T=5, H=64, D=128, E=64, lens=[3000, 2049, 2500, 100, 4096], top_k=300)
    elif kind == "random-k2000":  # short rows, k past SHORT_ROW_SELECT_MAX_K: 256 threads
        p = testing.random_problem(rng, T=3, H=64, D=128, E=64, lens=[2048, 1999, 2001], top_k=2000)
    elif kind == "long":  # past ROW_SELECT_MAX_LEN: the row select forced on a long row
        p = testing.random_problem(rng, T=2, H=8, D=64, E=64, lens=[9000, 4097], top_k=700)
    else:
        p = testing.adversarial_problem(kind, rng, H=64, D=128, E=64)
    args = [cp.asarray(a) for a in p.arrays()]
    out = {s: cuda_ops.score_topk(*args, p.top_k, precision=precision, return_scores=True, physical=True,
                                  _select=s) for s in ("rows", "multi")}
    np.testing.assert_array_equal(out["rows"][0].get(), out["multi"][0].get())
    assert out["rows"][1].get().tobytes() == out["multi"][1].get().tobytes()
    logical = cuda_ops.score_topk(*args, p.top_k, precision=precision, return_scores=True, _select="rows")
    testing.check_topk(p, logical[0].get(), logical[1].get(), tol=TOL[precision])


@PRECISIONS
def test_many_long_rows_use_the_wide_select_chunks(precision):
    # rows x chunks >= 2 x SMs: the histogram/filter kernels take 16 entries a thread
    # (fewer rows take 4); both against the reference
    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    rng = np.random.default_rng(23)
    T = 140
    lens = rng.integers(4200, 8001, size=T)
    p = testing.random_problem(rng, T=T, H=8, D=64, E=64, lens=lens, top_k=64)
    dev = cuda_ops.device_facts(cp.cuda.Device().id)
    ld = geometry.tiles_per_row(int(lens.max())) * geometry.TILE_ENTRIES
    assert geometry.select_fast_per_thread(T, ld, dev) == 16
    idx, sc = run_cuda(p, precision)
    testing.check_topk(p, idx, sc, tol=TOL[precision])


@pytest.mark.parametrize("kind", testing.ADVERSARIAL_KINDS + ("random",))
def test_ranked_and_sorted_candidates_give_the_same_answer(kind, monkeypatch):
    # the multi-CTA select orders a run's candidates by rank counting, within fine key bins
    # (few rows; a candidate a thread, or several in turns where the grid takes fewer CTAs a
    # row) or over every pair (the fewest rows), or by one CTA sorting each row (many rows);
    # or one CTA a row streams the row and ranks what it gathers (about an SM's worth of
    # rows): the five routes, forced, give the same bits
    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    rng = np.random.default_rng(92)
    if kind == "random":
        p = testing.random_problem(rng, T=6, H=64, D=128, E=64, lens=[9000, 5000, 4097, 0, 7000, 100], top_k=300)
    else:
        p = testing.adversarial_problem(kind, rng, H=64, D=128, E=64)
    args = [cp.asarray(a) for a in p.arrays()]
    out = {}
    try:
        rank_ctas = geometry.rank_ctas_per_row
        routes = {"all pairs": (False, True, True, False), "binned": (False, True, False, False),
                  "binned, one CTA a row": (False, True, False, True), "sorted": (False, False, False, False),
                  "streamed": (True, False, False, False)}
        for route, (streamed, ranked, all_pairs, one_cta) in routes.items():
            monkeypatch.setattr(geometry, "row_stream_select", lambda *a, r=streamed: r)
            monkeypatch.setattr(geometry, "rank_select", lambda *a, r=ranked: r)
            monkeypatch.setattr(geometry, "rank_all_pairs", lambda *a, r=all_pairs: r)
            monkeypatch.setattr(geometry, "rank_ctas_per_row", (lambda *a: 1) if one_cta else rank_ctas)
            cuda_ops.clear_plans()  # launch plans are cached by call shape, made under the rules of their time
            out[route] = cuda_ops.score_topk(*args, p.top_k, return_scores=True, physical=True, _select="multi")
    finally:
        monkeypatch.undo()
        cuda_ops.clear_plans()  # no plan made under the forced rules outlives this test
    for route in ("binned", "binned, one CTA a row", "sorted", "streamed"):
        np.testing.assert_array_equal(out["all pairs"][0].get(), out[route][0].get())
        assert out["all pairs"][1].get().tobytes() == out[route][1].get().tobytes()
    logical = cuda_ops.score_topk(*args, p.top_k, return_scores=True, _select="multi")
    testing.check_topk(p, logical[0].get(), logical[1].get(), tol=testing.TOL_FAST)


def test_a_rank_grid_past_one_wave_ranks_two_candidates_a_thread(monkeypatch):
    # mtp-2's shape, smaller heads: 128 rows of 4,200-8,192 entries at k = 1,024 rank with 4
    # CTAs a row (8 would take two waves), each thread ranking the candidates of its turns
    # (the streamed select, which takes this shape, forced off)
    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    rng = np.random.default_rng(93)
    p = testing.random_problem(rng, T=128, H=8, D=64, E=64, lens=rng.integers(4200, 8193, 128), top_k=1024)
    dev = cuda_ops.device_facts(cp.cuda.Device().id)
    assert geometry.rank_select(128, 1024, dev) and not geometry.rank_all_pairs(128, 1024)
    if dev.sm_count * geometry.RANK_CTAS_PER_SM < 128 * 8:  # the H200's 132 SMs: 528 < 1,024
        assert geometry.rank_ctas_per_row(1024, 128, dev) == 4
    monkeypatch.setattr(geometry, "row_stream_select", lambda *a: False)
    cuda_ops.clear_plans()
    try:
        idx, sc = run_cuda(p, "fast")
    finally:
        monkeypatch.undo()
        cuda_ops.clear_plans()
    testing.check_topk(p, idx, sc, tol=TOL["fast"])


@pytest.mark.parametrize("lens,top_k", [
    ("mtp", 1024),    # mtp-2's shape: several chunks a row, k = 1,024
    ("short", 512),   # rows shorter than one chunk, empty rows, lengths off every edge
    ("long", 1024),   # 40,000 entries: three chunks, the last one partial
    ("plateau", 100),  # every score 0: past the CTA's 4,096 candidate slots, the radix select over the row
])
@PRECISIONS
def test_the_streamed_select_on_an_sms_worth_of_rows(lens, top_k, precision):
    # about an SM's worth of rows or more take one CTA a row that streams its scores, gathers
    # the entries at or above its threshold bin and ranks them (topk_row_stream_kernel)
    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    dev = cuda_ops.device_facts(cp.cuda.Device().id)
    T = dev.sm_count  # >= three rows for every four SMs
    rng = np.random.default_rng(94)
    n = {"mtp": rng.integers(4200, 20000, T), "short": rng.integers(0, 3000, T), "long": np.full(T, 40000),
         "plateau": rng.integers(4200, 6000, T)}[lens]
    if lens == "short":
        n[:3] = [0, 1, top_k]  # an empty row, one entry, exactly k
    p = testing.random_problem(rng, T=T, H=8, D=64, E=64, lens=n, top_k=top_k)
    if lens == "plateau":
        p = testing.zero_plateau(p, rng)
    assert geometry.row_stream_select(T, top_k, dev)
    cuda_ops.clear_plans()
    # the multi-CTA select forced: rows this short would take the row select otherwise
    idx, sc = cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, precision=precision,
                                  return_scores=True, _select="multi")
    testing.check_topk(p, idx.get(), sc.get(), tol=TOL[precision])
    # the plan: one streamed run, no candidate buffer or counts, none of the other routes' kernels
    (plan,) = cuda_ops._PLANS.values()
    assert [run[4] for run in plan.runs] == [True]
    assert plan.part_bytes["cand"] == plan.part_bytes["count"] == 0
    assert not any(hasattr(plan, k) for k in ("filter_k", "rank_k", "final_k", "sample_k"))
