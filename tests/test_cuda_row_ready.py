"""The dense kernel hands each row to the row select once the CTAs holding it have ended
(kernels/common.cuh: row_ready): a count a row in the workspace's zeroed part, added to by
each scoring CTA at its end and read (then cleared) by the select, whose CTAs may run on
the SMs the scoring kernel's CTAs leave. Checked against the reference in graphs (with and
without programmatic dependent launch) and eagerly, over causal, ragged, empty, padded and
multi-run calls; the counts are zero after every call, after a scoring-only call, and after
a call interrupted between the two kernels; and the row kernel alone waits for a count,
clears it, and never hangs on a count that does not come."""

import numpy as np
import pytest

import indexer
from indexer import arrays, geometry, testing
from tests.gpu import requires_gpu, side_stream
from tests.test_cuda_counters_at_rest import call_interrupted_before, zeroed_part
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]


def dense_or_skip():
    from indexer import cuda_ops  # imports CuPy

    cp = arrays.cupy()
    if not geometry.dense_supported(64, 128, cuda_ops.device_facts(cp.cuda.Device().id)):
        pytest.skip("the dense kernel is a Hopper wgmma kernel")
    return cuda_ops


LAYOUTS = {  # counts, entries, ratio, top_k
    "causal": ([700], [1500], 2, 256),
    "ragged": ([5, 1, 0, 40, 3], [900, 64, 300, 2000, 65], None, 100),
    "one row": ([1], [1800], None, 512),
    "all empty": ([30, 4], [500, 100], None, 64),
}


def call_of(cuda_ops, args, top_k, budget=None):
    cp = arrays.cupy()
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    cu_dev = cp.asarray(cu)
    return lambda out, ws, score_only=False: cuda_ops.score_topk(
        *dev, top_k, return_scores=True, validate=False, out=out, workspace=ws, workspace_budget=budget,
        _cu_seqlens=cu_dev, _fast_kernel="dense", _score_only=score_only)


def problem(name, seed):
    counts, entries, ratio, top_k = LAYOUTS[name]
    args = grouped_problem(np.random.default_rng(seed), counts, H=64, D=128, E=64, seq_entries=entries,
                           ratio=ratio, top_k=top_k)
    if name == "all empty":
        args[7][:] = 0
    return args, top_k


def setup(name, seed, budget=None):
    """(cuda_ops, args, top_k, call, out, ws) of one layout: its call on a new workspace and
    out= buffers."""
    cuda_ops = dense_or_skip()
    cp = arrays.cupy()
    args, top_k = problem(name, seed)
    T = int(args[6][-1])
    out = (cp.empty((T, top_k), cp.int32), cp.empty((T, top_k), cp.float32))
    return cuda_ops, args, top_k, call_of(cuda_ops, args, top_k, budget=budget), out, indexer.Workspace()


def check(args, top_k, out, ws):
    """The answers in out against the reference, and every count zero at rest."""
    cp = arrays.cupy()
    cp.cuda.get_current_stream().synchronize()
    testing.check_topk(as_problem(*args, top_k), out[0].get(), out[1].get(), tol=testing.TOL_FAST)
    assert int(cp.count_nonzero(zeroed_part(ws))) == 0


@pytest.mark.parametrize("pdl", ["0", "1"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_graph_replays_and_eager_calls_match_the_reference_and_leave_the_counts_zero(monkeypatch, name, pdl):
    monkeypatch.setenv("INDEXER_PDL", pdl)
    _, args, top_k, call, out, ws = setup(name, 91)
    stream = side_stream()
    with stream:
        call(out, ws)  # compiles, sizes the workspace, leaves the zeroed part at rest
        check(args, top_k, out, ws)
        assert ws.zeroed(8)[1]
        stream.begin_capture()
        try:
            call(out, ws)
        finally:
            graph = stream.end_capture()
        for _ in range(3):
            for a in out:
                a.fill(-3)
            graph.launch(stream)
            check(args, top_k, out, ws)
        out[0].fill(-3)
        call(out, ws)  # eager again, after the replays
        check(args, top_k, out, ws)


def test_runs_of_rows_each_hand_their_rows_over():
    budget = 600_000
    _, args, top_k, call, out, ws = setup("causal", 92, budget=budget)
    T, max_len = int(args[6][-1]), int(args[7].max())
    ld = geometry.tiles_per_row(max_len) * geometry.TILE_ENTRIES
    rows = geometry.workspace_rows(T, ld, budget, 0, True, max_rows=geometry.DENSE_MAX_ROWS)
    assert rows < T  # several runs, each clearing its rows' counts for the next
    for _ in range(2):
        out[0].fill(-3)
        call(out, ws)
        check(args, top_k, out, ws)
        assert ws.zeroed(8)[1]


def test_a_scoring_only_call_counts_nothing():
    _, args, top_k, call, out, ws = setup("causal", 93)
    call(out, ws)
    call(None, ws, score_only=True)  # no select would clear what it counted
    assert ws.zeroed(8)[1]
    out[0].fill(-3)
    call(out, ws)
    check(args, top_k, out, ws)


def test_a_call_interrupted_before_its_select_clears_the_counts(monkeypatch):
    cuda_ops, args, top_k, call, out, ws = setup("causal", 94)
    cp = arrays.cupy()
    call(out, ws)  # compiles
    ld = geometry.tiles_per_row(int(args[7].max())) * geometry.TILE_ENTRIES
    row_name, _ = geometry.row_select_kernel(ld, top_k, cuda_ops._validate.MAX_TOP_K)
    row_kernel = cuda_ops._kernel("select_fast.cu", row_name, cp.cuda.Device().id)
    # interrupted after the dense kernel has counted its rows
    call_interrupted_before(monkeypatch, cuda_ops, row_kernel, lambda: call(out, ws))
    cp.cuda.get_current_stream().synchronize()
    assert int(cp.count_nonzero(zeroed_part(ws))) == 0
    assert not ws.zeroed(8)[1]  # marked dirty: the next call fills the part first
    out[0].fill(-3)
    call(out, ws)
    check(args, top_k, out, ws)
    assert ws.zeroed(8)[1]


def items_a_share(cu, lens, ctas, rows_an_item=3, unit=64):
    """The most positions of the dense kernel's item order that one CTA's share spans, from
    its first item to its last with units (kernels/score_dense.cu's schedule: items of three
    rows a sequence, taken first, last, second, ...; equal shares of their 64-entry units)."""
    items = [(f, min(rows_an_item, cu[b + 1] - f)) for b in range(len(cu) - 1)
             for f in range(cu[b], cu[b + 1], rows_an_item)]
    n = len(items)
    order = [p // 2 if p % 2 == 0 else n - 1 - p // 2 for p in range(n)]
    units = [-(-int(lens[f:f + r].max()) // unit) for f, r in (items[k] for k in order)]
    start = np.concatenate([[0], np.cumsum(units)])
    work, most = int(start[-1]), 0
    for c in range(ctas):
        u0, u1 = work * c // ctas, work * (c + 1) // ctas
        if u0 >= u1:
            continue
        first = int(np.searchsorted(start[:n], u0, side="right")) - 1  # item_of_tile
        last = max(p for p in range(first, n) if start[p] < u1 and units[p] > 0)
        most = max(most, last - first + 1)
    return most


@pytest.mark.exclusive  # holds the call's device time to a bound
def test_a_share_spanning_more_items_than_its_counting_threads_counts_every_row():
    """A causal sequence beside a sequence of padding rows (length 0): the padding's items
    lie between the causal ones in the dense kernel's order, so a CTA's share spans more
    items than the 128 its count at its end takes at once (it strides over them). A row left
    uncounted would be selected only after the row select's bounded wait (tens of ms) and
    still be right, so besides the answers the call's device time is held to a bound ~10x
    above its own (~1 ms) and far below that wait."""
    cuda_ops = dense_or_skip()
    cp = arrays.cupy()
    counts, top_k, budget = [4096, 3000], 256, 256 << 20
    args = grouped_problem(np.random.default_rng(96), counts, H=8, D=128, E=64, seq_entries=[1024, 64], ratio=4,
                           top_k=top_k)
    args[7][counts[0]:] = 0  # the padding rows
    T, ld = sum(counts), geometry.tiles_per_row(1024) * geometry.TILE_ENTRIES
    assert geometry.workspace_rows(T, ld, budget, 0, True, max_rows=geometry.DENSE_MAX_ROWS) >= T  # one run
    ctas = geometry.score_dense_launch(T, 8, 128, 1024, cuda_ops.device_facts(cp.cuda.Device().id)).grid[0]
    assert items_a_share(args[6], args[7], ctas) > 128  # the case this test is for
    out = (cp.empty((T, top_k), cp.int32), cp.empty((T, top_k), cp.float32))
    ws, call = indexer.Workspace(), call_of(cuda_ops, args, top_k, budget=budget)
    call(out, ws)  # compiles, sizes the workspace
    check(args, top_k, out, ws)
    out[0].fill(-3)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    call(out, ws)
    stop.record()
    stop.synchronize()
    check(args, top_k, out, ws)
    assert cp.cuda.get_elapsed_time(start, stop) < 10.0


def test_the_row_kernel_waits_for_each_count_and_clears_it():
    """Launched alone (no scoring kernel before it): rows whose counts are already their
    lengths are selected at once; a row whose count stays short is selected after the
    bounded wait (the wait for the previous grid, here none), not hung on; every count is
    zero afterwards."""
    from tests.gpu import row_topk
    from tests.test_cuda_row_select import run_row_select

    cp = arrays.cupy()
    rng = np.random.default_rng(95)
    rows, width, top_k = 6, 2048, 512
    scores = rng.standard_normal((rows, width)).astype(np.float32)
    lens = np.array([width, 700, 0, 1025, 3, 2000], dtype=np.int32)
    ready = lens.astype(np.uint32).copy()
    ready[3] -= 1  # never completed: the bounded wait ends
    ready_dev = cp.asarray(ready)
    got_idx, got_sc = run_row_select(cp.asarray(scores), width, lens, width, top_k, top_k, row_ready=ready_dev)
    for r in range(rows):
        want_idx, want_sc = row_topk(scores[r], int(lens[r]), top_k)
        np.testing.assert_array_equal(got_idx[r], want_idx, err_msg=f"row {r}")
        np.testing.assert_array_equal(got_sc[r], want_sc, err_msg=f"row {r}")
    assert int(cp.count_nonzero(ready_dev)) == 0
