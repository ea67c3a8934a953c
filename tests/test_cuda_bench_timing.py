"""The benchmark's timing on the GPU (indexer/bench.py): in time_graph each timed interval
holds the replayed graph's device time, neither the busy kernel queued before its start
event nor the host's submission of the graph; the prepared path times plain and grouped
calls."""

import pytest

from indexer import bench
from tests.gpu import requires_gpu, side_stream

pytestmark = [requires_gpu, pytest.mark.gpu, pytest.mark.exclusive]


def _max_clock_khz(cp):
    return cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["clockRate"]


@pytest.mark.parametrize("cycles", [200_000, 2_000_000])
def test_a_graph_of_one_busy_kernel_times_as_its_cycles(cycles):
    import cupy as cp

    ms = bench.time_graph(cp, lambda _: bench.busy(cp, cp.cuda.get_current_stream(), cycles), [None], repeats=9)
    at_max_clock = cycles / _max_clock_khz(cp)  # ms: the least the kernel can take
    # 2% for the event timer against the SM clock: an H100 timed 2,000,000 cycles at 1.0059 ms
    # against 1.0101 at its 1,980 MHz (the two clocks differ by ~0.4%)
    assert ms >= 0.98 * at_max_clock
    # not the busy kernel before the start event (BUSY_CYCLES more), nor a submission's
    # ~10 us: the graph's launch on the device and clocks ~10% under the maximum at most
    assert ms < 1.25 * at_max_clock + 0.015



def test_the_prepared_path_times_plain_and_grouped_calls():
    lines = []
    res = bench.run(["decode-latency", "mtp-2"], ["prepared"], 3, echo=lines.append)
    for row in res["cases"]:
        line = row["paths"]["prepared"]
        assert line["ms"] > 0 and line["extra_mb"] > 0 and "prepared (graph)" not in row["paths"]
    assert [ln.split()[:2] for ln in lines[2:]] == [["decode-latency", "prepared"], ["decode-latency", "floor"],
                                                    ["mtp-2", "prepared"], ["mtp-2", "floor"]]


def test_the_float8_path_scores_its_query_on_cupys_stream_eagerly_and_in_a_graph():
    torch = pytest.importorskip("torch")
    import cupy as cp
    import numpy as np

    from indexer import cuda_ops, testing

    p = testing.random_problem(np.random.default_rng(40), T=2, H=64, D=128, E=64, L=40, lens=[2000, 1500], top_k=128)
    dev = [cp.asarray(a) for a in p.arrays()]
    q8 = bench.float8_query(torch, dev[0])
    assert q8.dtype == torch.float8_e4m3fn and q8.is_cuda
    widened = cp.from_dlpack(q8.float())  # the float8 query's float32 values
    want = cuda_ops.score_topk(widened, *dev[1:], 128, return_scores=True)
    s = side_stream()
    with s, bench.torch_on_cupy_stream(torch, cp):
        assert torch.cuda.current_stream().cuda_stream == s.ptr  # the call's tensor takes CuPy's stream
        got = cuda_ops.score_topk(q8, *dev[1:], 128, return_scores=True)
    s.synchronize()
    for a, b in zip(got, want):
        assert a.cpu().numpy().tobytes() == cp.asnumpy(b).tobytes()
    # the bench's own rows: eager and replayed from a graph captured on CuPy's stream
    res = bench.run(["decode-latency"], ["fast-f8"], 3, echo=lambda _: None)
    row = res["cases"][0]["paths"]
    assert row["fast-f8"]["ms"] > 0 and row["fast-f8 (graph)"]["ms"] > 0
