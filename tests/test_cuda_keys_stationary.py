"""The keys-stationary scoring kernel (kernels/score_ks.cu; the default for chunks of rows of
up to 256 sequences over longer pools, forced with fast_kernel='ks'): every row streamed past
its sequence's key groups, decoded once. Its scores must be the single-query wgmma kernel's
bit for bit (the same staged query, decode, MMAs and epilogue arithmetic), and its answers
the reference's."""

import numpy as np
import pytest

from indexer import arrays, testing
from tests.gpu import check_grouped_kernel_limits, pairs_at_any_work, requires_gpu
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]


def _hopper():
    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    return geometry.ks_supported(64, 128, cuda_ops.device_facts(cp.cuda.Device().id))


def _both(args, top_k, kernel="ks"):
    """(indices, scores) of the keys-stationary kernel (forced, or 'auto') and of the
    single-query kernel."""
    from indexer import cuda_ops

    cp = arrays.cupy()
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    cu_dev = cp.asarray(cu)
    ks = cuda_ops.score_topk(*dev, top_k, return_scores=True, _cu_seqlens=cu_dev, _fast_kernel=kernel)
    single = cuda_ops.score_topk(*dev, top_k, return_scores=True, _cu_seqlens=cu_dev, _fast_kernel="wgmma-single")
    return [x.get() for x in ks], [x.get() for x in single]


@pytest.mark.parametrize("rows,entries,E,top_k,lens", [
    (9, 6000, 64, 64, "random"),        # ragged lengths inside the sequence (0 and 1 included)
    (40, 1200, 2, 50, "random"),        # 2-entry blocks: a 16-byte scale piece spans a block pair
    (7, 5000, 256, 300, "full"),        # every row sees every entry; groups off the table's end
    (300, 3000, 16, 128, "causal"),     # few groups, many rows: a CTA's share inside a group; causal ends
    (1, 800, 64, 900, "full"),          # one row, top_k past its entries: -1 padding
    (3, 100_000, 64, 500, "full"),      # 783 (group, row) items on the SMs: shares cross groups
])
def test_keys_stationary_matches_the_single_query_kernel_and_the_reference(rows, entries, E, top_k, lens):
    if not _hopper():
        pytest.skip("the keys-stationary kernel is a Hopper wgmma kernel")
    rng = np.random.default_rng(rows * 31 + entries + E)
    args = grouped_problem(rng, [rows], H=64, D=128, E=E, seq_entries=[entries], top_k=top_k)
    if lens == "full":
        args = args[:-1] + (np.full(rows, entries, dtype=np.int32),)
    elif lens == "causal":
        args = args[:-1] + (np.minimum(entries, 2 * entries // 3 + np.arange(rows, dtype=np.int32)),)
    else:
        l = args[-1].copy()
        l[0], l[-1] = 0, 1
        args = args[:-1] + (l,)
    (ks_idx, ks_sc), (one_idx, one_sc) = _both(args, top_k)
    np.testing.assert_array_equal(ks_idx, one_idx)
    assert ks_sc.tobytes() == one_sc.tobytes()
    testing.check_topk(as_problem(*args, top_k), ks_idx, ks_sc, tol=testing.TOL_FAST)


@pytest.mark.parametrize("counts,entries,top_k", [
    ([20, 0, 35, 3, 50], [3000, 500, 9000, 100, 20_000], 64),  # an empty sequence, a short one
    ([1] * 9 + [40], [700] * 9 + [5000], 16),                   # decode rows beside a chunk
    ([130, 130], [2100, 60_000], 128),                           # shares crossing a sequence's end
])
def test_several_sequences_each_read_their_own_keys(counts, entries, top_k):
    # the items of a launch run sequence by sequence: each sequence's rows against its own
    # table's groups, up to its own longest row; bit for bit the single-query kernel's
    if not _hopper():
        pytest.skip("the keys-stationary kernel is a Hopper wgmma kernel")
    rng = np.random.default_rng(sum(counts) + top_k)
    args = grouped_problem(rng, counts, H=64, D=128, E=64, seq_entries=entries, top_k=top_k)
    (ks_idx, ks_sc), (one_idx, one_sc) = _both(args, top_k)
    np.testing.assert_array_equal(ks_idx, one_idx)
    assert ks_sc.tobytes() == one_sc.tobytes()
    testing.check_topk(as_problem(*args, top_k), ks_idx, ks_sc, tol=testing.TOL_FAST)


def test_keys_stationary_takes_at_most_256_sequences_and_stays_in_bounds_on_bad_offsets():
    from indexer import geometry

    if not _hopper():
        pytest.skip("the keys-stationary kernel is a Hopper wgmma kernel")
    check_grouped_kernel_limits("ks", geometry.KS_MAX_SEQS, grouped_problem)


def test_rows_short_of_most_groups_skip_them():
    # a long pool, most rows seeing a few thousand of its entries: groups past every row are
    # no work, and a warpgroup skips the rows that end before its entries
    if not _hopper():
        pytest.skip("the keys-stationary kernel is a Hopper wgmma kernel")
    rng = np.random.default_rng(11)
    rows, entries = 40, 20_000
    args = grouped_problem(rng, [rows], H=64, D=128, E=64, seq_entries=[entries], top_k=200)
    lens = rng.integers(0, 3000, size=rows).astype(np.int32)
    lens[5], lens[17], lens[30] = entries, 0, 385
    args = args[:-1] + (lens,)
    (ks_idx, ks_sc), (one_idx, one_sc) = _both(args, 200)
    np.testing.assert_array_equal(ks_idx, one_idx)
    assert ks_sc.tobytes() == one_sc.tobytes()
    testing.check_topk(as_problem(*args, 200), ks_idx, ks_sc, tol=testing.TOL_FAST)


def test_auto_takes_it_for_many_long_rows_of_one_sequence():
    from indexer import cuda_ops, geometry, validate

    if not _hopper():
        pytest.skip("the keys-stationary kernel is a Hopper wgmma kernel")
    cp = arrays.cupy()
    rng = np.random.default_rng(12)
    rows, entries = geometry.KS_MIN_ROWS, geometry.KS_MIN_LEN + 500
    args = grouped_problem(rng, [rows], H=64, D=128, E=64, seq_entries=[entries], top_k=64)
    args = args[:-1] + (np.full(rows, entries, dtype=np.int32) - np.arange(rows, dtype=np.int32),)
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    prob = validate.check_score_topk(*dev, 64)
    facts = cuda_ops.device_facts(cp.cuda.Device().id)
    assert cuda_ops._scoring_kernel("fast", prob, facts, dev[0], dev[3], "auto", cp.asarray(cu)) == "ks"
    # two rows a sequence: too little work for the pair kernel here (geometry.pairs_pay), the
    # single-query kernel; the pair kernel where the work bound allows it
    pairs = cp.asarray(np.arange(0, rows + 1, 2, dtype=np.int32))
    assert not geometry.pairs_pay(rows, prob.max_len, rows // 2)
    assert cuda_ops._scoring_kernel("fast", prob, facts, dev[0], dev[3], "auto", pairs) == "wgmma"
    with pairs_at_any_work():
        assert cuda_ops._scoring_kernel("fast", prob, facts, dev[0], dev[3], "auto", pairs) == "pairs"
    (auto_idx, auto_sc), (one_idx, one_sc) = _both(args, 64, kernel="auto")
    np.testing.assert_array_equal(auto_idx, one_idx)
    assert auto_sc.tobytes() == one_sc.tobytes()
    testing.check_topk(as_problem(*args, 64), auto_idx, auto_sc, tol=testing.TOL_FAST)  # and right
