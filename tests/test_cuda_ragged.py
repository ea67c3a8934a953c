"""score_topk_ragged on the GPU against the per-token reference: causal prefill rows,
multi-token decode groups, empty groups and groups of one."""

import contextlib

import numpy as np
import pytest

import indexer
from indexer import arrays, testing
from tests.gpu import pairs_at_any_work, requires_gpu
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]
TOL = {"exact": testing.TOL_EXACT, "fast": testing.TOL_FAST}


@pytest.mark.parametrize("precision", ["fast", "exact"])
@pytest.mark.parametrize("counts,ratio,top_k", [
    ([300], 4, 16),            # causal prefill: rows see 0 .. 75 entries, many shorter than k
    ([2, 2, 2, 2], None, 64),  # multi-token decode
    ([0, 5, 0, 1, 0], None, 32),  # empty groups and a group of one
    ([1], None, 8),
])
def test_ragged_matches_reference(precision, counts, ratio, top_k):
    cp = arrays.cupy()
    rng = np.random.default_rng(sum(counts) + top_k)
    args = grouped_problem(rng, counts, H=64, D=128, E=64, seq_entries=[500] * len(counts), ratio=ratio, top_k=top_k)
    dev = [cp.asarray(a) for a in args]
    idx, sc = indexer.score_topk_ragged(*dev, top_k, precision=precision, return_scores=True)
    testing.check_topk(as_problem(*args, top_k), idx.get(), sc.get(), tol=TOL[precision])
    phys = indexer.score_topk_ragged(*dev, top_k, precision=precision, physical=True)
    testing.check_topk(as_problem(*args, top_k), phys.get(), tol=TOL[precision], physical=True)


def test_ragged_validate_false_with_malformed_offsets_stays_in_bounds():
    cp = arrays.cupy()
    rng = np.random.default_rng(40)
    args = list(grouped_problem(rng, [3, 2], H=8, D=64, E=16))
    args[6] = np.array([0, 9, 1], dtype=np.int32)  # malformed: not monotone, past T
    dev = [cp.asarray(a) for a in args]
    idx = indexer.score_topk_ragged(*dev, 4, validate=False)
    cp.cuda.Device().synchronize()
    assert idx.shape == (5, 4)
    got, lens = idx.get(), args[7]
    assert np.all((got >= -1) & (got < lens[:, None])), got  # only entries each row can see


def test_ragged_calls_take_the_larger_default_budget_and_honour_one_given():
    # 300 rows of 56,000 entries: ~64.2 MiB of scores alone (a run of 300 rows streams its
    # select: no candidate buffer), one run under the grouped calls' default budget (256
    # MiB, past score_topk's 64), twenty-two runs under 4 MiB;
    # the same bits either way, and neither workspace past its budget (plus the per-token
    # table and the 1 MiB granule)
    cp = arrays.cupy()
    rng = np.random.default_rng(42)
    args = grouped_problem(rng, [150, 150], H=64, D=128, E=64, seq_entries=[56_000, 56_000], top_k=64)
    dev = [cp.asarray(a) for a in args]
    ws_default, ws_small = indexer.Workspace(), indexer.Workspace()
    whole = indexer.score_topk_ragged(*dev, 64, return_scores=True, workspace=ws_default)
    runs = indexer.score_topk_ragged(*dev, 64, return_scores=True, workspace=ws_small, workspace_budget=4 << 20)
    np.testing.assert_array_equal(whole[0].get(), runs[0].get())
    assert whole[1].get().tobytes() == runs[1].get().tobytes()
    table = 300 * 875 * 4  # the per-token block table (L = 875 blocks of 64)
    assert (64 << 20) < ws_default.nbytes <= (256 << 20) + table + (2 << 20)
    assert ws_small.nbytes <= (4 << 20) + table + (2 << 20)
    sub = [a[:4] for a in args[:2]]  # a few rows against the reference (the rest: same bits)
    small = (*sub, *args[2:5], args[5], np.array([0, 4, 4], np.int32), args[7][:4])
    got = indexer.score_topk_ragged(*[cp.asarray(a) for a in small], 64, return_scores=True,
                                    workspace_budget=1)
    testing.check_topk(as_problem(*small, 64), got[0].get(), got[1].get(), tol=testing.TOL_FAST)
    np.testing.assert_array_equal(got[0].get(), whole[0].get()[:4])


@pytest.mark.parametrize("offsets", [
    [0, 3, 5],     # good
    [1, 3, 5],     # does not start at 0
    [0, 3, 4],     # does not end at T
    [0, 6, 5],     # decreasing, past T
])
@pytest.mark.parametrize("bad_lens", [False, True])
def test_ragged_checks_its_values_in_one_device_launch(monkeypatch, offsets, bad_lens):
    """On device arrays a ragged call checks cu_seqlens_q with the other values in one launch
    of the value-check kernel, and rejects what the NumPy backend rejects with the same
    message (the offsets first when the lengths are bad too)."""
    from indexer import device_checks

    cp = arrays.cupy()
    rng = np.random.default_rng(41)
    args = list(grouped_problem(rng, [3, 2], H=8, D=64, E=16))
    args[6] = np.array(offsets, dtype=np.int32)
    if bad_lens:
        args[7] = args[7].copy()
        args[7][1] = 10_000
    launches = []
    real = device_checks.first_failures
    monkeypatch.setattr(device_checks, "first_failures", lambda **kw: launches.append(kw) or real(**kw))

    def outcome(fn):
        try:
            fn()
            return "ok"
        except ValueError as exc:
            return str(exc)

    host = outcome(lambda: indexer.score_topk_ragged(*args, 4, backend="numpy"))
    assert not launches
    dev = [cp.asarray(a) for a in args]
    assert outcome(lambda: indexer.score_topk_ragged(*dev, 4)) == host
    assert len(launches) == 1 and launches[0]["cu_seqlens"] is not None
    assert (host == "ok") == (offsets == [0, 3, 5] and not bad_lens)
    if offsets != [0, 3, 5]:
        assert host.startswith("cu_seqlens_q")


@pytest.mark.parametrize("counts,entries,top_k,lens", [
    ([2, 2, 2, 2], [3000] * 4, 100, None),     # multi-token decode: every pair shares
    ([3, 1, 4, 0, 5], [2000] * 5, 50, None),   # odd groups: pairs straddle sequences, a last row alone
    # shared pairs past 256 tiles (32,768 entries): packed histograms flushed mid-row
    ([3, 3], [40_000, 33_000], 300, [39_000, 40_000, 100, 33_000, 32_900, 0]),
    ([9], [6000], 64, None),                   # one sequence, ragged lengths inside it
    # the single-row kernel (pairs off) in runs of 600, a sequence across two runs
    ([700, 500], [300, 200], 40, None),
    # more pairs than the schedule's 1,024 slots (starts of groups of four pairs), a
    # sequence of one row (a lone unit) at the end
    ([4500, 1], [600, 50], 32, None),
    # more rows than one run takes (8,192): two runs of 4,151, the second starting inside
    # a sequence, with a sequence start (at an odd row: a lone row each side) inside it
    ([4000, 3999, 302], [64, 40, 30], 8, None),
    # last tiles of at most 64 entries for both rows of a pair (its second 64-entry half
    # skipped) beside pairs where only one row reaches past 64; every entry selected
    ([8], [400], 300, [64, 65, 192, 129, 192, 193, 1, 0]),
    # the same edges past 4,096 entries (histograms and the filter, not the row select)
    ([4], [5000], 100, [4096 + 64, 4096 + 63, 4096 + 65, 4096 + 1]),
    # multi-token decode of three rows a request: units (2, 3) and (8, 9) span two sequences
    # (row 3 a lone row of length 0), row 14 alone at the end, row 13 of length 0 in a pair
    ([3, 3, 3, 3, 3], [3000, 700, 4100, 64, 1], 40, [3000, 2999, 10, 0, 700, 1, 4100, 4099, 4098, 64, 63, 63,
                                                     1, 0, 1]),
])
@pytest.mark.parametrize("split", ["auto", "always", "never"])
def test_row_pairs_share_key_tiles_and_match_single_rows(monkeypatch, counts, entries, top_k, lens, split):
    # the wgmma path scores consecutive rows of one sequence as pairs sharing each key tile;
    # the same call with pairs off ("wgmma-single") must give the same bits, and both the
    # reference's answer. split: a call's lone rows in a launch of their own (m64n64 MMAs)
    # where geometry.pairs_split says so, always, or never (in the pair's form)
    from indexer import cuda_ops, geometry

    if split != "auto":
        monkeypatch.setattr(geometry, "pairs_split", lambda T, n_seq, _s=split: _s == "always")
        monkeypatch.setattr(cuda_ops, "_PLANS", {})  # plans made under the patched rule, dropped after
    cp = arrays.cupy()
    dev_facts = cuda_ops.device_facts(cp.cuda.Device().id)
    if not geometry.wgmma_supported(64, 128, dev_facts):
        pytest.skip("the pair kernel is the Hopper wgmma path")
    rng = np.random.default_rng(sum(counts) + top_k)
    args = grouped_problem(rng, counts, H=64, D=128, E=64, seq_entries=entries, top_k=top_k)
    if lens is not None:
        args = args[:-1] + (np.array(lens, dtype=np.int32),)
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    cu_dev = cp.asarray(cu)
    # forced: 'auto' takes the keys-stationary kernel for many long rows of one sequence
    pairs = cuda_ops.score_topk(*dev, top_k, return_scores=True, _cu_seqlens=cu_dev, _fast_kernel="wgmma")
    single = cuda_ops.score_topk(*dev, top_k, return_scores=True, _cu_seqlens=cu_dev, _fast_kernel="wgmma-single")
    np.testing.assert_array_equal(pairs[0].get(), single[0].get())
    assert pairs[1].get().tobytes() == single[1].get().tobytes()
    testing.check_topk(as_problem(*args, top_k), pairs[0].get(), pairs[1].get(), tol=TOL["fast"])


@pytest.mark.parametrize("counts,any_work,kind", [([1] * 6, False, "ws"), ([1, 0, 2, 1], False, "ws"),
                                                  ([1, 1], False, "wgmma"), ([1, 2, 1], False, "ws"),
                                                  ([3, 3, 3], False, "ws"), ([1, 2, 1], True, "pairs"),
                                                  ([3, 3, 3], True, "pairs"), ([1] * 6, True, "ws")])
def test_grouped_calls_take_the_pair_kernel_only_where_rows_outnumber_sequences(counts, any_work, kind):
    # one row a sequence (decode through the grouped call) shares nothing: a single-query
    # kernel (geometry.pairs_preferred), here the warp-specialised one, as for the per-token
    # call of these few rows of up to 5,000 entries (geometry.ws_preferred: T x max_len <=
    # WS_MAX_WORK, max_len >= WS_MIN_ROW_ENTRIES), the wgmma kernel for rows of up to 3,000
    # (below WS_MIN_ROW_ENTRIES); so do rows that outnumber their sequences in a call of too
    # little work for the pair kernel (geometry.pairs_pay), and with its work bounds at 0
    # they take the pair kernel; the answers the reference's either way
    from indexer import cuda_ops, geometry, validate

    cp = arrays.cupy()
    if not geometry.wgmma_supported(64, 128, cuda_ops.device_facts(cp.cuda.Device().id)):
        pytest.skip("the pair kernel is the Hopper wgmma path")
    with pairs_at_any_work() if any_work else contextlib.nullcontext():
        rng = np.random.default_rng(len(counts) + sum(counts))
        args = grouped_problem(rng, counts, H=64, D=128, E=64, seq_entries=[3000, 700, 5000, 64][: len(counts)]
                               + [900] * max(0, len(counts) - 4), top_k=48)
        q, w, k, s, g, table, cu, lens = args
        per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
        dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
        prob = validate.check_score_topk(*dev, 48)
        facts = cuda_ops.device_facts(cp.cuda.Device().id)
        assert cuda_ops._scoring_kernel("fast", prob, facts, dev[0], dev[3], "auto", cp.asarray(cu)) == kind
        idx, sc = indexer.score_topk_ragged(*(cp.asarray(a) for a in args), 48, return_scores=True)
        testing.check_topk(as_problem(*args, 48), idx.get(), sc.get(), tol=TOL["fast"])


@pytest.mark.parametrize("E", [2, 8, 16, 256])
def test_row_pairs_with_small_and_large_blocks(E):
    # the pair kernel's key ring and global scales by block size: at E <= 8 rows r and r + 8
    # of a tile lie in different blocks, at E < 32 a warp issues several copies a tile, at
    # E = 256 a tile is part of one block
    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    if not geometry.wgmma_supported(64, 128, cuda_ops.device_facts(cp.cuda.Device().id), E):
        pytest.skip("the pair kernel is the Hopper wgmma path")
    rng = np.random.default_rng(E)
    args = grouped_problem(rng, [2, 3, 2], H=64, D=128, E=E, seq_entries=[900, 700, 1000], top_k=50)
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    idx, sc = cuda_ops.score_topk(*dev, 50, return_scores=True, _cu_seqlens=cp.asarray(cu), _fast_kernel="wgmma")
    testing.check_topk(as_problem(*args, 50), idx.get(), sc.get(), tol=TOL["fast"])


@pytest.mark.parametrize("with_workspace", [False, True])
def test_device_block_table_expansion_matches_numpy(with_workspace):
    """The per-token table built by the device kernel equals NumPy's gather, on well-formed
    and malformed offsets (decreasing, past T, negative: validation off), empty sequences,
    a table that is a strided view, and shapes with no entries; with a workspace the same
    view of its memory is reused for a shape seen before."""
    from indexer import ragged

    cp = arrays.cupy()
    rng = np.random.default_rng(61)
    ws = indexer.Workspace() if with_workspace else None
    cases = [(np.array([0, 2, 2, 5], np.int32), 5), (np.array([0, 9, 1, 5], np.int32), 5),
             (np.array([0, 0, 0, 0], np.int32), 3), (np.array([-4, 3, 2, 40], np.int32), 7),
             (np.array([0, 7], np.int32), 7), (np.array([0, 1, 3, 3, 3, 8], np.int32), 8)]
    for _ in range(20):
        B = int(rng.integers(1, 9))
        cu = np.sort(rng.integers(0, 50, B + 1)).astype(np.int32)
        cu[0] = 0
        if rng.random() < 0.3:
            cu = rng.integers(-5, 60, B + 1).astype(np.int32)  # malformed
        cases.append((cu, int(rng.integers(0, 60))))
    for cu, T in cases:
        B = cu.shape[0] - 1
        L = int(rng.integers(0, 40))
        wide = rng.integers(-3, 1000, (B, 2 * L + 1)).astype(np.int32)
        table = wide[:, : 2 * L : 2] if rng.random() < 0.5 else np.ascontiguousarray(wide[:, :L])
        want = ragged.expand_block_table(table, cu, T)
        got = ragged.expand_block_table(cp.asarray(table) if table.flags.c_contiguous else cp.asarray(wide)[:, : 2 * L : 2],
                                        cp.asarray(cu), T, workspace=ws)
        assert got.shape == (T, L) and got.dtype == np.int32
        np.testing.assert_array_equal(got.get(), want)
        if ws is not None:  # the same shape again: the kept view, the new contents
            again = ragged.expand_block_table(cp.asarray(table[::-1].copy()), cp.asarray(cu), T, workspace=ws)
            np.testing.assert_array_equal(again.get(), ragged.expand_block_table(table[::-1].copy(), cu, T))
    with pytest.raises(ValueError, match="block_table"):  # no sequence to copy rows from
        ragged.expand_block_table(cp.zeros((0, 4), cp.int32), cp.zeros(1, cp.int32), 3, workspace=ws)


@pytest.mark.parametrize("prepared", [False, True])
def test_a_misaligned_block_table_is_refused_by_name_before_any_launch(prepared):
    """A grouped call's (B, L) table at an odd address: refused by name, as score_topk refuses
    its per-token table (before, the expansion kernel read it as int32 and the misaligned
    load ended the process's CUDA context); the device stays usable."""
    cp = arrays.cupy()
    a = [cp.asarray(x) for x in grouped_problem(np.random.default_rng(5), [2, 1], H=64, D=128, E=64)]
    table = a[5]
    buf = cp.zeros(table.nbytes + 8, cp.uint8)
    buf[2:2 + table.nbytes] = table.view(cp.uint8).ravel()  # the same bytes, 2 bytes past a boundary
    odd = cp.ndarray(table.shape, cp.int32, memptr=buf.data + 2)
    assert odd.flags.c_contiguous
    with pytest.raises(ValueError, match="^block_table: expected a device array aligned to its 4-byte elements"):
        if prepared:
            indexer.prepare(*a[:5], odd, a[7], 4, cu_seqlens_q=a[6], validate=False)
        else:
            indexer.score_topk_ragged(*a[:5], odd, a[6], a[7], 4, validate=False)
    cp.cuda.runtime.deviceSynchronize()  # no fault was left behind
    want = indexer.score_topk_ragged(*[x.get() for x in a], 4, backend="numpy")
    assert (indexer.score_topk_ragged(*a, 4).get() == want).all()


def test_host_arrays_beside_device_arrays_are_copied_and_the_result_follows_q():
    """A NumPy array beside CuPy arrays (a KeyPool on the GPU scoring host queries, as the
    README's first snippet does) is copied to the device: the same bits as the all-device
    call, a NumPy result where q is NumPy; a NumPy array out of C order is refused by name
    there too; a grouped call's NumPy offsets or table beside the other on the GPU is copied
    as well (a GPU KeyPool's table with NumPy offsets: the README's grouped snippet), checked
    first as the NumPy backend checks it."""
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(6), T=2, H=8, D=64, E=16, L=4, lens=[40, 64], top_k=10)
    host = p.arrays()
    want = indexer.score_topk(*[cp.asarray(x) for x in host], p.top_k, return_scores=True)
    for i, name in enumerate(testing.ARRAY_NAMES):
        mixed = [cp.asarray(x) for x in host]
        mixed[i] = host[i]
        got = indexer.score_topk(*mixed, p.top_k, return_scores=True)
        assert isinstance(got[0], np.ndarray) == (i == 0)
        for a, b in zip(got, want):
            assert arrays.to_numpy(a).tobytes() == b.get().tobytes()
        wide = np.repeat(host[i], 2, axis=-1)
        mixed[i] = wide[..., ::2]
        with pytest.raises(ValueError, match=f"^{name}: expected a C-contiguous array$"):
            indexer.score_topk(*mixed, p.top_k)
    args = grouped_problem(np.random.default_rng(7), [2, 1], H=8, D=64, E=16)
    want = indexer.score_topk_ragged(*[cp.asarray(x) for x in args], 4, return_scores=True)
    for i, name in ((5, "block_table"), (6, "cu_seqlens_q")):
        mixed = [cp.asarray(x) for x in args]
        mixed[i] = args[i]
        got = indexer.score_topk_ragged(*mixed, 4, return_scores=True, validate=False)
        for a, b in zip(got, want):
            assert a.get().tobytes() == b.get().tobytes()
        mixed[i] = np.repeat(args[i], 2, axis=-1)[..., ::2]
        with pytest.raises(ValueError, match=f"^{name}: expected a C-contiguous array$"):
            indexer.score_topk_ragged(*mixed, 4)
        mixed[i] = args[i].astype(np.int64)
        with pytest.raises(TypeError, match=f"^{name}: expected dtype int32, got int64$"):
            indexer.score_topk_ragged(*mixed, 4)
