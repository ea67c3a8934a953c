"""The PyTorch operators (indexer.torch_ops) on CUDA tensors: the public call's answers bit
for bit, inside torch.compile (fullgraph, the inductor backend and its CUDA graphs) and a
captured torch.cuda.CUDAGraph replayed with new contents, and value checks on request."""

import numpy as np
import pytest

import indexer
from indexer import testing
from tests.gpu import pair_of_problems, requires_gpu
from tests.test_ragged import grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]
torch = pytest.importorskip("torch")
iops = pytest.importorskip("indexer.torch_ops")


@pytest.fixture(autouse=True)
def fresh_signatures():
    """Each test starts with no signature seen (the operators' PreparedCalls are a cache of
    the process's calls: tests stay independent of their order)."""
    iops._PREPARED.clear()
    iops._SIGHTED.clear()


def tensors(p):
    return [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in p.arrays()]


def assert_same(got, expected):
    assert torch.equal(got[0], expected[0])
    assert got[1].cpu().numpy().tobytes() == expected[1].cpu().numpy().tobytes()


def capture(call):
    """``call()`` captured in a ``torch.cuda.CUDAGraph`` after one warm-up call on a side
    stream (kernels compiled, the workspace sized); returns the graph and what the captured
    call returned."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = call()
    return graph, result


def assert_replays_follow(graph, x, sources, out, top_k):
    """Each of ``sources`` copied into the captured inputs ``x``, the graph replayed: ``out``
    holds the public call's answer for it."""
    for src in sources:
        for dst, s in zip(x, src):
            dst.copy_(s)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(out, indexer.score_topk(*src, top_k, return_scores=True))


@pytest.mark.parametrize("precision", ["fast", "exact"])
@pytest.mark.parametrize("physical", [False, True])
def test_operator_gives_the_public_calls_bits(precision, physical):
    p = testing.random_problem(np.random.default_rng(90), T=6, H=64, D=128, E=64, lens=[0, 5, 3000, 9000, 64, 700],
                               top_k=256)
    x = tensors(p)
    got = iops.score_topk(*x, p.top_k, precision=precision, physical=physical)
    assert got[0].is_cuda and got[0].dtype == torch.int32 and got[1].dtype == torch.float32
    assert_same(got, indexer.score_topk(*x, p.top_k, precision=precision, physical=physical, return_scores=True))
    logical = got if not physical else iops.score_topk(*x, p.top_k, precision=precision)
    testing.check_topk(p, logical[0].cpu().numpy(), logical[1].cpu().numpy(),
                       tol=testing.TOL_FAST if precision == "fast" else testing.TOL_EXACT)
    assert iops.workspace(x[0].device).nbytes > 0  # its scratch came from the operators' workspace


def test_ragged_operator_gives_the_grouped_calls_bits():
    from indexer import cuda_ops

    # 48 rows over up to 25,000 entries: past geometry.PAIRS_MIN_WORK, the pair kernel
    arrays = grouped_problem(np.random.default_rng(91), [40, 1, 0, 7], H=64, D=128, E=64,
                             seq_entries=[25_000, 300, 100, 1800], top_k=300, ratio=1)
    x = [torch.from_numpy(a).cuda() for a in arrays]
    cuda_ops.clear_plans()
    got = iops.score_topk_ragged(*x, 300, physical=True)
    assert_same(got, indexer.score_topk_ragged(*x, 300, physical=True, return_scores=True))
    assert {pl.kind for pl in cuda_ops._PLANS.values()} == {"pairs"}


def test_compiled_model_keeps_the_operator_in_one_graph():
    p = testing.random_problem(np.random.default_rng(92), T=4, H=64, D=128, E=64, lens=[4000, 0, 123, 2500],
                               top_k=128)
    x = tensors(p)

    def layer(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens):
        idx, sc = iops.score_topk(q * 2.0, w * 0.5, keys_fp4, key_scale, key_gscale, block_table, valid_lens, 128,
                                  physical=True)
        return idx, torch.where(idx >= 0, sc, torch.zeros_like(sc)).sum(dim=1)

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)  # inductor; a graph break would raise
    got = compiled(*x)
    want = layer(*x)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_compiled_with_cuda_graphs_scores_each_steps_new_inputs():
    # mode="reduce-overhead": inductor's CUDA graphs, warmed up, captured, then replayed on
    # copies of every step's inputs
    a, b = pair_of_problems(93, T=2, H=64, D=128, E=64, lens=[5000, 1200], top_k=200)
    xa, xb = tensors(a), tensors(b)

    def step(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens):
        return iops.score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, 200)

    torch._dynamo.reset()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for x in (xa, xb, xa, xb, xb, xa):
        got = compiled(*x)
        assert_same(got, indexer.score_topk(*x, 200, return_scores=True))


def test_captured_in_a_cuda_graph_and_replayed_with_new_contents():
    a, b = pair_of_problems(94, T=3, H=64, D=128, E=64, lens=[3000, 0, 800], top_k=100)
    x, new = tensors(a), tensors(b)
    graph, out = capture(lambda: iops.score_topk(*x, 100))
    assert_replays_follow(graph, x, (new, x), out, 100)


def test_values_are_checked_when_asked():
    p = testing.random_problem(np.random.default_rng(95), T=2, H=8, D=64, E=16, lens=40, L=3, top_k=8)
    x = tensors(p)
    x[6][1] = 10**6
    with pytest.raises(ValueError, match="^valid_lens"):
        iops.score_topk(*x, 8, validate=True)
    with pytest.raises(TypeError, match="^w: expected"):
        iops.score_topk(x[0], x[1].cpu(), *x[2:], 8)  # another device


def test_out_forms_give_the_public_calls_bits_in_the_callers_tensors():
    p = testing.random_problem(np.random.default_rng(96), T=5, H=64, D=128, E=64, lens=[0, 4100, 64, 900, 7000],
                               top_k=256)
    x = tensors(p)
    want = indexer.score_topk(*x, 256, physical=True, return_scores=True)
    out = (torch.full((5, 256), 9, dtype=torch.int32, device="cuda"), torch.zeros((5, 256), device="cuda"))
    pointers = tuple(t.data_ptr() for t in out)
    assert iops.score_topk(*x, 256, physical=True, out=out) is out
    assert tuple(t.data_ptr() for t in out) == pointers
    assert_same(out, want)
    only = torch.zeros((5, 256), dtype=torch.int32, device="cuda")
    iops.score_topk(*x, 256, physical=True, out=only)
    assert torch.equal(only, want[0])
    arrays = grouped_problem(np.random.default_rng(97), [30, 0, 9], H=64, D=128, E=64, seq_entries=[30_000, 50, 900],
                             top_k=128, ratio=1)
    g = [torch.from_numpy(a).cuda() for a in arrays]
    grouped = (torch.empty((39, 128), dtype=torch.int32, device="cuda"), torch.empty((39, 128), device="cuda"))
    iops.score_topk_ragged(*g, 128, out=grouped)
    assert_same(grouped, indexer.score_topk_ragged(*g, 128, return_scores=True))
    with pytest.raises(TypeError, match="^out: expected a PyTorch CUDA tensor"):
        iops.score_topk(*x, 256, out=torch.zeros((5, 256), dtype=torch.int32))  # on the host


def test_out_form_compiled_and_captured():
    a, b = pair_of_problems(98, T=3, H=64, D=128, E=64, lens=[3000, 0, 800], top_k=100)
    x, new = tensors(a), tensors(b)
    out = (torch.empty((3, 100), dtype=torch.int32, device="cuda"), torch.empty((3, 100), device="cuda"))

    def layer(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, idx, sc):
        iops.score_topk(q * 1.0, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, 100, out=(idx, sc))
        return (idx >= 0).sum(dim=1)

    torch._dynamo.reset()
    counts = torch.compile(layer, fullgraph=True)(*x, *out)  # inductor: the mutation kept in place
    want = indexer.score_topk(*x, 100, return_scores=True)
    assert_same(out, want)
    assert torch.equal(counts, (want[0] >= 0).sum(dim=1))
    graph, _ = capture(lambda: iops.score_topk(*x, 100, out=out))
    assert_replays_follow(graph, x, (new, x), out, 100)


def test_write_keys_operator_on_cuda_tensors_eager_compiled_and_captured():
    """torch.ops.indexer.write_keys on CUDA tensors (bfloat16 keys, padding slots): the host
    form's bytes eagerly (checked and not), inside torch.compile(fullgraph=True), and from a
    captured torch.cuda.CUDAGraph replayed with each step's keys and slots copied in."""
    from tests.pool_steps import adversarial_keys, empty_pool, padded_call

    def host_bytes(steps, P, E, D):
        pool = empty_pool(P, E, D, np)
        for keys, slots in steps:
            indexer.write_keys(keys.float().cpu().numpy(), slots.cpu().numpy(), *pool)
        return pool

    def assert_pool(dev, host):
        for d, h in zip(dev, host):
            np.testing.assert_array_equal(d.cpu().numpy(), h)

    rng = np.random.default_rng(96)
    P, E, D = 24, 16, 64
    steps = []
    for _ in range(4):
        keys, slots, _, _ = padded_call(rng, D, E, P)
        steps.append((torch.from_numpy(keys).to("cuda", torch.bfloat16), torch.from_numpy(slots).cuda()))
    want = host_bytes(steps, P, E, D)
    for validate in (True, False):
        dev = [torch.from_numpy(a).cuda() for a in empty_pool(P, E, D, np)]
        for keys, slots in steps:
            iops.write_keys(keys, slots, *dev, validate=validate)
        assert_pool(dev, want)

    torch._dynamo.reset()
    compiled = torch.compile(lambda k, s, *pool: iops.write_keys(k, s, *pool), fullgraph=True)
    dev = [torch.from_numpy(a).cuda() for a in empty_pool(P, E, D, np)]
    for keys, slots in steps:
        compiled(keys, slots, *dev)
    assert_pool(dev, want)

    # a decode loop: B keys a step at the next entry of B sequences' blocks, replayed
    B = 6
    decode = [(torch.from_numpy(adversarial_keys(rng, B, D)).cuda(),
               torch.tensor([b * E + step for b in range(B)], device="cuda")) for step in range(E)]
    want = host_bytes([(k, s) for k, s in decode], P, E, D)
    dev = [torch.from_numpy(a).cuda() for a in empty_pool(P, E, D, np)]
    keys_buf, slots_buf = decode[0][0].clone(), decode[0][1].clone()
    # (capture's warm-up call writes step 0, which the first replay writes again afresh)
    graph, _ = capture(lambda: iops.write_keys(keys_buf, slots_buf, *dev))
    for keys, slots in decode:
        keys_buf.copy_(keys)
        slots_buf.copy_(slots)
        graph.replay()
    torch.cuda.synchronize()
    assert_pool(dev, want)


def test_repeated_signatures_run_through_a_prepared_call_with_the_public_bits():
    """A signature's calls after its second run through an ``indexer.PreparedCall`` of it
    (``iops._PREPARED``), which replays a CUDA graph once the same tensors come again: every
    call's answer is the public call's, with new contents in the same tensors and with new
    tensors, in the functional and _out forms and the grouped operator; a capture of the
    operator still holds its launches; and no prepared call keeps the caller's tensors."""
    import gc
    import weakref

    a, b = pair_of_problems(99, T=3, H=64, D=128, E=64, lens=[5000, 0, 900], top_k=128)
    sources = [tensors(a), tensors(b)]
    static = [t.clone() for t in sources[0]]
    out = (torch.empty((3, 128), dtype=torch.int32, device="cuda"), torch.empty((3, 128), device="cuda"))
    for i in range(8):
        src = sources[i % 2]
        want = indexer.score_topk(*src, 128, return_scores=True)
        for dst, s in zip(static, src):
            dst.copy_(s)
        assert_same(iops.score_topk(*static, 128, out=out), want)  # same tensors: replays
        assert_same(iops.score_topk(*static, 128), want)  # new results each call
        assert_same(iops.score_topk(*[t.clone() for t in src], 128), want)  # new tensors
    assert len(iops._PREPARED) == 1  # one signature: the functional and _out forms, new tensors or not
    assert all(step._graphs for step in iops._PREPARED.values())  # replayed from graphs

    graph, captured = capture(lambda: iops.score_topk(*static, 128, out=out))
    assert_replays_follow(graph, static, (sources[1], sources[0]), out, 128)

    arrays = grouped_problem(np.random.default_rng(100), [30, 0, 9], H=64, D=128, E=64, seq_entries=[30_000, 50, 900],
                             top_k=128, ratio=1)
    g = [torch.from_numpy(x).cuda() for x in arrays]
    want = indexer.score_topk_ragged(*g, 128, return_scores=True)
    for _ in range(4):
        assert_same(iops.score_topk_ragged(*g, 128), want)
    assert len(iops._PREPARED) == 2

    kept = [t.clone() for t in sources[1]]
    for _ in range(4):  # a new signature (top_k): the third and fourth calls launch from views
        iops.score_topk(*kept, 100)
    assert len(iops._PREPARED) == 3
    torch.cuda.synchronize()
    assert all(view is None for step in iops._PREPARED.values() for view in step._views)
    refs = [weakref.ref(t) for t in kept]
    del kept
    gc.collect()
    assert all(r() is None for r in refs)


def test_a_prepared_call_that_cannot_be_made_leaves_the_public_call(monkeypatch):
    """Where a signature's PreparedCall cannot be made, its calls keep taking the public call
    (each has gone through before): the same answers, no error, no retry each call."""
    import indexer.prepared

    made = []

    def failing(*args, **kwargs):
        made.append(1)
        raise RuntimeError("no prepared call here")

    monkeypatch.setattr(indexer.prepared, "prepare", failing)
    p = testing.random_problem(np.random.default_rng(102), T=2, H=64, D=128, E=64, lens=[2000, 64], top_k=32)
    x = tensors(p)
    want = indexer.score_topk(*x, 32, return_scores=True)
    for _ in range(5):
        assert_same(iops.score_topk(*x, 32), want)
    assert not iops._PREPARED
    assert len(made) == 1


def test_no_prepared_call_is_made_inside_a_callers_capture():
    """A signature's second call inside the caller's torch.cuda.graph capture makes no
    PreparedCall (its construction would run inside the capture); the captured graph replays
    the public call's answers, and the next eager call makes it."""
    a, b = pair_of_problems(101, T=2, H=64, D=128, E=64, lens=[3000, 700], top_k=64)
    x, new = tensors(a), tensors(b)
    graph, out = capture(lambda: iops.score_topk(*x, 64))  # its warm-up call is the first
    assert not iops._PREPARED
    assert_replays_follow(graph, x, (new, x), out, 64)
    assert_same(iops.score_topk(*x, 64), indexer.score_topk(*x, 64, return_scores=True))
    assert len(iops._PREPARED) == 1
