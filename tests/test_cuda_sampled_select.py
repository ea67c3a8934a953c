"""The sampled candidate threshold (kernels/select_fast.cu: topk_sample_kernel, then
topk_filter_kernel<..., true> and topk_final_kernel<..., true>; the select of the
keys-stationary kernel's runs): each row's threshold key is the m-th largest of 8,192 of
its scores sampled in 512 spread chunks (exactly the k-th largest when the sample is the
whole row), every entry at or above it a candidate. The kernels are run on score rows built
to reach each path: rows longer and shorter than the sample, lengths off the chunks' edges,
rows whose sample sits above the rest (fewer than k candidates: the row selected from its
scores), plateaus of equal scores (more candidates than the buffer holds: the same), NaN,
ties at the k-th score, small and large k. Against NumPy: score descending, then index
ascending. Then the public path: grouped calls through the keys-stationary kernel with the
sampled threshold forced, bit for bit the histogram select's answers and the reference's."""

import numpy as np
import pytest

from indexer import arrays, testing
from tests.gpu import requires_gpu, row_topk
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]

SAMPLE_CHUNKS, SAMPLE_ENTRIES = 512, 8192  # kernels/select_fast.cu: kSampleChunks, kSampleEntries


def _sampled(n):
    """The entries topk_sample_kernel reads of a row of n > SAMPLE_ENTRIES entries."""
    starts = (np.arange(SAMPLE_CHUNKS, dtype=np.int64) * n // SAMPLE_CHUNKS) & ~15
    return (starts[:, None] + np.arange(16)).ravel()


def _rows(kind, rng, rows, width, lens):
    x = rng.standard_normal((rows, width)).astype(np.float32)
    if kind == "sample-high":  # the sampled entries above all others: tau above the k-th key
        for r in range(rows):
            if lens[r] > SAMPLE_ENTRIES:
                x[r, :lens[r]] -= np.float32(100)
                x[r, _sampled(int(lens[r]))] += np.float32(100)
    elif kind == "plateau":  # every score equal: every entry a candidate, past the buffer
        x[:] = np.float32(0.5)
    elif kind == "ties":  # 3,000 copies of one score among the winners: ties at the k-th key
        for r in range(rows):
            x[r, rng.choice(width, 3000, replace=False)] = np.float32(2.0)
    elif kind == "nan":  # 30% NaN; row 1 all NaN
        x[rng.random((rows, width)) < 0.3] = np.nan
        x[1] = np.nan
    elif kind == "exponents":  # magnitudes from 2^-100 to 2^100, both signs
        e = rng.integers(-100, 101, size=(rows, width)).astype(np.float32)
        x = (np.sign(x) * np.exp2(e)).astype(np.float32)
    return x


def _select_sampled(scores, lens, top_k):
    """(indices, scores) of the sampled select's three kernels on a float32 score matrix."""
    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    rows, ld = scores.shape
    dev = cp.cuda.Device().id
    cap = geometry.CANDIDATE_CAP
    per = 16
    chunks = geometry.select_fast_chunks(ld, per)
    sample = cuda_ops._kernel("select_fast.cu", "topk_sample_kernel<256>", dev)
    filt = cuda_ops._kernel("select_fast.cu", f"topk_filter_kernel<256, {per}, true>", dev)
    final = cuda_ops._kernel("select_fast.cu", f"topk_final_kernel<1024, {cap}, true>", dev, 8 * cap)
    s = cp.asarray(scores)
    n = cp.asarray(lens)
    count = cp.full(rows, 12345, dtype=cp.uint32)  # cleared by the sample kernel
    tau = cp.zeros(rows, dtype=cp.uint32)
    cand = cp.zeros((rows, cap), dtype=cp.uint64)
    hist = cp.zeros((rows, geometry.HIST_BINS), dtype=cp.uint32)
    table = cp.zeros((rows, 1), dtype=cp.int32)
    out_idx = cp.full((rows, top_k), 7, dtype=cp.int32)
    out_sc = cp.full((rows, top_k), 7, dtype=cp.float32)
    i32 = np.int32
    sample((rows,), (256,), (s, np.int64(ld), n, i32(ld), i32(top_k), count, tau))
    filt((chunks, rows), (256,), (s, np.int64(ld), n, i32(ld), tau, i32(top_k), count, cand, i32(cap)))
    final((rows,), (1024,), (s, np.int64(ld), n, i32(ld), hist, count, cand, i32(top_k), table, i32(1), i32(ld),
                             i32(1), i32(0), out_idx, out_sc, tau), shared_mem=8 * cap)
    return out_idx.get(), out_sc.get(), count.get(), tau.get()


@pytest.mark.parametrize("kind", ["random", "sample-high", "plateau", "ties", "nan", "exponents"])
@pytest.mark.parametrize("width,top_k", [(40_000, 1024), (40_000, 16), (40_000, 2048), (6000, 512), (130_000, 1024)])
def test_sampled_select_orders_the_winners_like_numpy(kind, width, top_k):
    rng = np.random.default_rng(width + top_k + len(kind))
    rows = 10
    lens = rng.integers(0, width + 1, size=rows).astype(np.int32)
    lens[0], lens[1], lens[2] = width, top_k // 2, 0         # a full row, one short of k, an empty one
    lens[3], lens[4] = SAMPLE_ENTRIES, SAMPLE_ENTRIES + 1    # the sample the whole row; just past it
    lens[5] = min(width, SAMPLE_ENTRIES + 16 * SAMPLE_CHUNKS + 7)  # chunks off 16-entry multiples of n
    lens = np.minimum(lens, width).astype(np.int32)
    scores = _rows(kind, rng, rows, width, lens)
    got_idx, got_sc, count, tau = _select_sampled(scores, lens, top_k)
    for r in range(rows):
        want_idx, want_sc = row_topk(scores[r], int(lens[r]), top_k)
        np.testing.assert_array_equal(got_idx[r], want_idx, err_msg=f"row {r} (n = {lens[r]}, count {count[r]})")
        np.testing.assert_array_equal(got_sc[r], want_sc, err_msg=f"row {r} (n = {lens[r]}, count {count[r]})")
    if kind == "random" and width == 40_000 and top_k == 1024:  # the common path: ~2k candidates, no fallback
        long_rows = lens >= 20_000
        assert np.all(count[long_rows] >= top_k) and np.all(count[long_rows] <= 4 * top_k), count[long_rows]
    if kind == "sample-high" and width > 2 * SAMPLE_ENTRIES and top_k > 32:
        # the fallback was needed: fewer than k candidates where the sample sat high (rows
        # past twice the sample, where fewer than k sampled keys lie at or above tau)
        assert np.any((count < top_k) & (lens > 2 * SAMPLE_ENTRIES)), count
    if kind == "plateau" and width > SAMPLE_ENTRIES:  # and here more candidates than the buffer holds
        assert np.any(count > 8192), count


def test_the_sample_of_a_whole_row_is_its_exact_kth_key():
    # n <= 8,192: tau is the k-th largest key, so exactly the entries at or above the k-th
    # score are candidates (here distinct scores: k of them)
    rng = np.random.default_rng(3)
    rows, width, k = 4, 8192, 300
    scores = rng.standard_normal((rows, width)).astype(np.float32)
    lens = np.array([8192, 5000, 301, 17], dtype=np.int32)
    got_idx, got_sc, count, tau = _select_sampled(scores, lens, k)
    np.testing.assert_array_equal(count, [k, k, k, 17])
    assert tau[3] == 0  # fewer than k entries: every one a candidate
    for r in range(rows):
        want_idx, _ = row_topk(scores[r], int(lens[r]), k)
        np.testing.assert_array_equal(got_idx[r], want_idx)


@pytest.mark.parametrize("rows,entries,E,top_k,causal", [
    (40, 30_000, 64, 1024, True),     # a causal chunk: rows longer and shorter than the sample
    (24, 9000, 16, 64, False),        # rows just past the sample; small k
    (20, 70_000, 64, 2048, False),    # the largest k it takes
])
def test_keys_stationary_calls_give_the_histogram_selects_answers(rows, entries, E, top_k, causal):
    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    if not geometry.ks_supported(64, 128, cuda_ops.device_facts(cp.cuda.Device().id)):
        pytest.skip("the keys-stationary kernel is a Hopper wgmma kernel")
    rng = np.random.default_rng(rows + entries + top_k)
    args = grouped_problem(rng, [rows], H=64, D=128, E=E, seq_entries=[entries], top_k=top_k)
    if causal:  # lengths growing with the row, from below the sample to the whole pool
        args = args[:-1] + (np.linspace(100, entries, rows).astype(np.int32),)
    else:
        lens = args[-1].copy()
        lens[0], lens[1] = 0, entries
        args = args[:-1] + (lens,)
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    got = {}
    for select in ("sampled", "histogram"):
        res = cuda_ops.score_topk(*dev, top_k, return_scores=True, _cu_seqlens=cp.asarray(cu), _fast_kernel="ks",
                                  _select=select)
        got[select] = [x.get() for x in res]
    np.testing.assert_array_equal(got["sampled"][0], got["histogram"][0])
    assert got["sampled"][1].tobytes() == got["histogram"][1].tobytes()
    testing.check_topk(as_problem(*args, top_k), *got["sampled"], tol=testing.TOL_FAST)


def test_sampled_runs_take_no_histograms_and_leave_the_workspace_at_rest():
    # runs that take the sampled threshold count no histogram, so a call whose runs all take
    # it allocates none (the workspace's zeroed part is not made) and clears none; calls of
    # the histogram select on the same workspace, before and after, still find it zero
    from indexer import Workspace, cuda_ops, geometry

    cp = arrays.cupy()
    if not geometry.ks_supported(64, 128, cuda_ops.device_facts(cp.cuda.Device().id)):
        pytest.skip("the keys-stationary kernel is a Hopper wgmma kernel")
    rng = np.random.default_rng(5)
    args = grouped_problem(rng, [24], H=64, D=128, E=64, seq_entries=[20_000], top_k=256)
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    ws = Workspace()
    zeroed = (cp.cuda.Device().id, "zeroed")

    def call(select):
        res = cuda_ops.score_topk(*dev, 256, return_scores=True, workspace=ws, _cu_seqlens=cp.asarray(cu),
                                  _fast_kernel="ks", _select=select)
        return [x.get() for x in res]

    first = call("sampled")
    assert zeroed not in ws._buffers
    hist = call("histogram")
    assert not cp.any(ws._buffers[zeroed]), "the histogram select left its counts"
    again = call("sampled")
    assert not cp.any(ws._buffers[zeroed]), "a sampled call wrote into the zeroed part"
    for got in (first, again):
        np.testing.assert_array_equal(got[0], hist[0])
        assert got[1].tobytes() == hist[1].tobytes()
    testing.check_topk(as_problem(*args, 256), *first, tol=testing.TOL_FAST)


def test_keys_stationary_runs_of_an_sms_worth_of_short_rows_stream_their_select():
    # a run of the keys-stationary kernel whose rows would stream (row_stream_select), too
    # many to rank (rank_select: they took the sampled threshold before) and of up to
    # SAMPLED_STREAM_MAX_LEN entries takes a histogram pass and the streamed select rather
    # than the sampled threshold (v105): the same answers bit for bit as the sampled
    # threshold forced, and the reference's; the workspace left at rest
    from indexer import Workspace, cuda_ops, geometry

    cp = arrays.cupy()
    dev_facts = cuda_ops.device_facts(cp.cuda.Device().id)
    if not geometry.ks_supported(8, 128, dev_facts):
        pytest.skip("the keys-stationary kernel is a Hopper wgmma kernel")
    seqs, per_seq, entries, top_k = 6, 32, 5000, 1024
    T = seqs * per_seq
    ld = geometry.tiles_per_row(entries) * geometry.TILE_ENTRIES
    if not (geometry.ks_preferred(T, 8, 128, entries, dev_facts, 64, seqs) and geometry.sampled_streams(
            T, top_k, ld, dev_facts) and not geometry.rank_select(T, top_k, dev_facts)):
        pytest.skip(f"{T} rows of {entries} entries reach another route on {dev_facts.sm_count} SMs")
    rng = np.random.default_rng(105)
    args = grouped_problem(rng, [per_seq] * seqs, H=8, D=128, E=64, seq_entries=[entries] * seqs, top_k=top_k)
    lens = args[-1].copy()
    lens[0], lens[1], lens[2] = 0, entries, top_k // 2  # an empty row, a full one, one short of k
    args = args[:-1] + (lens,)
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    ws = Workspace()
    got, plans = {}, {}
    for select in ("auto", "sampled"):
        cuda_ops.clear_plans()  # the call's plan alone in the cache
        res = cuda_ops.score_topk(*dev, top_k, return_scores=True, workspace=ws, _cu_seqlens=cp.asarray(cu),
                                  _select=select)
        got[select] = [x.get() for x in res]
        plans[select] = list(cuda_ops._PLANS.values())
    # (a run: r0, r1, rows, sampled, streamed, ranked, ...)
    assert [pl.kind for pl in plans["auto"]] == ["ks"] and [pl.kind for pl in plans["sampled"]] == ["ks"]
    assert all(run[4] and not run[3] for run in plans["auto"][0].runs), "the auto call's runs do not stream"
    assert all(run[3] for run in plans["sampled"][0].runs), "the forced call's runs do not take the sample"
    np.testing.assert_array_equal(got["auto"][0], got["sampled"][0])
    assert got["auto"][1].tobytes() == got["sampled"][1].tobytes()
    testing.check_topk(as_problem(*args, top_k), *got["auto"], tol=testing.TOL_FAST)
    zeroed = (cp.cuda.Device().id, "zeroed")
    assert zeroed in ws._buffers and not cp.any(ws._buffers[zeroed]), "the streamed select left its counts"
