"""One workspace shared by calls on several streams and threads (Workspace.turn): each call
waits for the workspace's previous one, so every answer is the one the same call gives
alone. The oracle is that lone call on a workspace of its own: the GPU path's answers are
bit-identical from run to run (tests/test_cuda_score_topk.py checks them against the
reference), and the shapes here are too large for a NumPy reference in a test.

A long call (waves of scoring, then its select reading its scores from the workspace)
with a short one beside it on another stream is the race the turn closes: without the wait
the short call's scores and histograms land in the long one's while its select reads them
(exp/turn_off_race.py runs these tests with the turn switched off; docs/performance.md v87
gives how often they failed). Each stream first waits on the GPU for the same spin kernel,
so that the two calls start together there, whatever the host's launch time."""

import concurrent.futures

import numpy as np
import pytest

import indexer
from indexer import arrays, testing
from tests.gpu import requires_gpu, side_stream

pytestmark = [requires_gpu, pytest.mark.gpu]


SPIN_US = 1_000  # the spin before each stream's call: far longer than a call's launch on the host
LAGS_US = (0, 30, 100, 200)  # the second stream's extra spin: its call starts that far into the first's

_SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def spin(stream, us=SPIN_US):
    """One thread that spins ``us`` microseconds on ``stream`` (a CuPy stream)."""
    cp = arrays.cupy()
    cp.RawKernel(_SPIN, "spin")((1,), (1,), (np.uint64(us * 1000),), stream=stream)


def problems():
    """A long call (32 rows of one sequence's 262,144 entries, the model's 64 heads: ~0.3 ms
    on an H100) and a short one (3 rows of up to 3,000 entries) of other shapes, so they take
    other plans but the same workspace parts."""
    rng = np.random.default_rng(87)
    long = testing.random_problem(rng, T=32, H=64, D=128, E=64, lens=[262_144] * 31 + [100_000], top_k=1024,
                                  shared_blocks=True)
    short = testing.random_problem(rng, T=3, H=64, D=128, E=64, lens=[3_000, 2_500, 17], top_k=512)
    return long, short


def on_device(p):
    cp = arrays.cupy()
    return [cp.asarray(a) for a in p.arrays()]


def alone(dev, p, **kw):
    """The call on a workspace of its own, finished: (indices, scores) on the host."""
    cp = arrays.cupy()
    idx, sc = indexer.score_topk(*dev, p.top_k, return_scores=True, workspace=indexer.Workspace(), **kw)
    cp.cuda.Device().synchronize()
    return idx.get(), sc.get()


def fresh_out(p):
    cp = arrays.cupy()
    T = p.q.shape[0]
    return cp.full((T, p.top_k), -7, dtype=cp.int32), cp.full((T, p.top_k), 7.0, dtype=cp.float32)


def assert_same(got, want):
    np.testing.assert_array_equal(got[0].get(), want[0])
    assert got[1].get().tobytes() == want[1].tobytes()


def grouped_long():
    """The long call as one sequence's 32 query rows (``score_topk_ragged``: its per-token
    table is the workspace's too), with its lone answer's call."""
    rng = np.random.default_rng(88)
    p = testing.random_problem(rng, T=32, H=64, D=128, E=64, lens=[262_144] * 30 + [1_000, 200_000], top_k=1024,
                               shared_blocks=True)
    cp = arrays.cupy()
    q, w, keys, scale, gscale, table, lens = on_device(p)
    cu = cp.asarray(np.array([0, 32], np.int32))

    def call(workspace, **kw):
        return indexer.score_topk_ragged(q, w, keys, scale, gscale, table[:1], cu, lens, p.top_k,
                                         return_scores=True, workspace=workspace, **kw)
    return p, call


@pytest.mark.parametrize("grouped", [False, True], ids=["per-token", "grouped"])
def test_calls_on_two_streams_sharing_a_workspace_each_give_their_lone_answer(grouped):
    long, short = problems()
    dev_long, dev_short = on_device(long), on_device(short)
    if grouped:
        long, call_long = grouped_long()
    else:
        def call_long(workspace, **kw):
            return indexer.score_topk(*dev_long, long.top_k, return_scores=True, workspace=workspace, **kw)
    want_long = tuple(x.get() for x in call_long(indexer.Workspace()))
    want_short = alone(dev_short, short)
    ws = indexer.Workspace()
    a, b = side_stream(), side_stream()
    for lag in LAGS_US:  # the short call's start, from the long one's, on the GPU
        out_long, out_short = fresh_out(long), fresh_out(short)
        spin(a)
        spin(b, SPIN_US + lag)
        with a:
            call_long(ws, out=out_long, validate=False)
        with b:
            indexer.score_topk(*dev_short, short.top_k, return_scores=True, out=out_short, workspace=ws,
                               validate=False)
        a.synchronize()
        b.synchronize()
        assert_same(out_long, want_long)
        assert_same(out_short, want_short)


def test_prepared_calls_replayed_on_another_stream_wait_for_the_workspace():
    """A prepared call's graph replays (its second call on the same pointers on) take the
    turn too: a replay on stream b after an eager call on stream a."""
    long, short = problems()
    dev_long, dev_short = on_device(long), on_device(short)
    want_long, want_short = alone(dev_long, long), alone(dev_short, short)
    ws = indexer.Workspace()
    step_long = indexer.prepare(*dev_long, long.top_k, return_scores=True, workspace=ws, validate=False)
    step_short = indexer.prepare(*dev_short, short.top_k, return_scores=True, workspace=ws, validate=False)
    a, b = side_stream(), side_stream()
    out_long, out_short = fresh_out(long), fresh_out(short)
    for _ in range(4):  # the first two calls of each run eagerly (the second captures), the rest replay
        with a:
            spin(a)
            step_long(*dev_long, out=out_long)
        with b:
            spin(b)
            step_short(*dev_short, out=out_short)
        a.synchronize()
        b.synchronize()
        assert_same(out_long, want_long)
        assert_same(out_short, want_short)


@pytest.mark.parametrize("streams", ["own", "per-thread default"])
def test_threads_on_their_own_streams_sharing_a_workspace_each_give_their_lone_answers(streams):
    """Each thread on a stream of its own, or on its per-thread default stream (one handle,
    cudaStreamPerThread, that names another stream in every thread)."""
    cp = arrays.cupy()
    long, short = problems()
    dev = {"long": on_device(long), "short": on_device(short)}
    want = {"long": alone(dev["long"], long), "short": alone(dev["short"], short)}
    by_name = {"long": long, "short": short}
    ws = indexer.Workspace()
    order = [["long", "short", "short", "long"], ["short", "long", "long", "short"],
             ["long", "long", "short", "short"], ["short", "short", "long", "long"]]

    def work(names):
        stream = side_stream() if streams == "own" else cp.cuda.Stream.ptds
        results = []
        with stream:
            for name in names:
                spin(stream)
                p = by_name[name]
                out = fresh_out(p)
                indexer.score_topk(*dev[name], p.top_k, return_scores=True, out=out, workspace=ws, validate=False)
                results.append((name, out))
        stream.synchronize()
        return results

    with concurrent.futures.ThreadPoolExecutor(len(order)) as pool:
        done = list(pool.map(work, order))
    for results in done:
        for name, out in results:
            assert_same(out, want[name])


@pytest.mark.filterwarnings("ignore:ExternalStream is deprecated:DeprecationWarning")
def test_the_pytorch_operators_on_two_torch_streams_share_their_device_workspace_safely():
    """``indexer.torch_ops`` keeps one workspace a device: two PyTorch streams calling the
    operator back to back each get the lone call's answer."""
    torch = pytest.importorskip("torch")
    cp = arrays.cupy()
    import indexer.torch_ops as iops  # noqa: PLC0415  (PyTorch is optional)

    long, short = problems()
    t = {name: [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in p.arrays()]
         for name, p in (("long", long), ("short", short))}
    want = {"long": alone(on_device(long), long), "short": alone(on_device(short), short)}
    by_name = {"long": long, "short": short}
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    for lag in LAGS_US:
        spin(cp.cuda.ExternalStream(s1.cuda_stream))
        spin(cp.cuda.ExternalStream(s2.cuda_stream), SPIN_US + lag)
        got = {}
        for name, stream in (("long", s1), ("short", s2)):
            with torch.cuda.stream(stream):
                got[name] = iops.score_topk(*t[name], by_name[name].top_k)
        torch.cuda.synchronize()
        for name, (idx, sc) in got.items():
            np.testing.assert_array_equal(idx.cpu().numpy(), want[name][0])
            assert sc.cpu().numpy().tobytes() == want[name][1].tobytes()


def test_a_call_on_a_stream_dropped_meanwhile_is_waited_for_by_the_next_stream():
    """The last call's stream is kept alive by the workspace: dropped by the caller while its
    call still runs (a spin holds it on the GPU), its handle is not handed to the next stream
    made, which would pass for the same stream and skip the wait; the next call on a new
    stream gives its lone answer."""
    long, short = problems()
    dev_long, dev_short = on_device(long), on_device(short)
    want = alone(dev_short, short)
    ws = indexer.Workspace()
    first = side_stream()
    handle = first.ptr
    spin(first)
    with first:
        indexer.score_topk(*dev_long, long.top_k, workspace=ws, validate=False)
    del first  # the caller's last reference
    second = side_stream()
    assert second.ptr != handle  # the first stream is not destroyed yet: its handle is not reused
    with second:
        got = indexer.score_topk(*dev_short, short.top_k, return_scores=True, workspace=ws, validate=False)
    second.synchronize()
    assert_same(got, want)
