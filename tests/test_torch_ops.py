"""The PyTorch operators (indexer.torch_ops) on CPU tensors: the NumPy reference's answers,
torch.library's own checks of the registration, torch.compile with fullgraph=True, and bad
input refused by name. Skipped where PyTorch is not installed."""

import subprocess
import sys
import warnings

import numpy as np
import pytest

from indexer import ops, reference, score_topk, score_topk_ragged, testing
from tests.test_ragged import grouped_problem

torch = pytest.importorskip("torch")
iops = pytest.importorskip("indexer.torch_ops")


def tensors(p):
    return [torch.from_numpy(a) for a in p.arrays()]


def test_importing_the_package_registers_no_operator():
    code = "import sys, indexer; assert 'indexer.torch_ops' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_older_pytorch_is_refused_by_name_at_import():
    # PyTorch before 2.4 has no torch.library.register_fake: said in one line, not an
    # AttributeError from the middle of the registration
    code = ("import torch, torch.library\n"
            "del torch.library.register_fake\n"
            "try:\n"
            "    import indexer.torch_ops\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.startswith("indexer.torch_ops: needs PyTorch 2.4 or later (torch.library.register_fake), found "), out
    assert torch.__version__ in out


@pytest.mark.parametrize("physical", [False, True])
def test_operator_gives_the_reference_answer(physical):
    rng = np.random.default_rng(70)
    p = testing.random_problem(rng, T=5, H=8, D=64, E=16, lens=[0, 1, 37, 80, 64], top_k=24)
    idx, sc = iops.score_topk(*tensors(p), p.top_k, physical=physical)
    assert idx.dtype == torch.int32 and sc.dtype == torch.float32 and tuple(idx.shape) == (5, 24)
    want = reference.score_topk(*p.arrays(), p.top_k, return_scores=True, physical=physical)
    np.testing.assert_array_equal(idx.numpy(), want[0])
    np.testing.assert_array_equal(sc.numpy(), want[1])
    # torch.ops names the same operator
    again = torch.ops.indexer.score_topk(*tensors(p), p.top_k, "fast", physical, False)
    np.testing.assert_array_equal(again[0].numpy(), want[0])


def test_inputs_that_require_grad_give_results_that_do_not():
    # the operators have no gradient: autograd passes them by, with no warning
    rng = np.random.default_rng(76)
    p = testing.random_problem(rng, T=2, H=8, D=64, E=16, lens=30, top_k=8)
    x = tensors(p)
    x[0].requires_grad_()
    x[1].requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idx, sc = iops.score_topk(*x, p.top_k)
    assert not idx.requires_grad and not sc.requires_grad
    np.testing.assert_array_equal(idx.numpy(), reference.score_topk(*p.arrays(), p.top_k))


def test_ragged_operator_gives_the_grouped_answer():
    arrays = grouped_problem(np.random.default_rng(71), [3, 0, 2, 5], seq_entries=[40, 9, 70, 33], ratio=1)
    idx, sc = iops.score_topk_ragged(*(torch.from_numpy(a) for a in arrays), 12, physical=True)
    want = score_topk_ragged(*arrays, 12, backend="numpy", return_scores=True, physical=True)
    np.testing.assert_array_equal(idx.numpy(), want[0])
    np.testing.assert_array_equal(sc.numpy(), want[1])


def test_torch_library_checks_the_registrations():
    # schema, fake (meta) implementation against the real one, and AOT dispatch with dynamic shapes
    rng = np.random.default_rng(72)
    p = testing.random_problem(rng, T=3, H=8, D=64, E=16, lens=[50, 0, 17], top_k=12)
    torch.library.opcheck(torch.ops.indexer.score_topk.default, (*tensors(p), p.top_k, "fast", True, False))
    arrays = grouped_problem(rng, [4, 1, 0], ratio=2)
    torch.library.opcheck(torch.ops.indexer.score_topk_ragged.default,
                          (*(torch.from_numpy(a) for a in arrays), 12, "exact", False, False))


def test_compiled_with_fullgraph_keeps_one_node_and_the_answer():
    rng = np.random.default_rng(73)
    p = testing.random_problem(rng, T=4, H=8, D=64, E=16, lens=[64, 3, 0, 41], top_k=16)
    x = tensors(p)

    def topk_then_use(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens):
        idx, sc = iops.score_topk(q * 1.0, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, 16)
        return idx, torch.where(idx >= 0, sc, torch.zeros_like(sc)).sum(dim=1)  # torch ops around it

    torch._dynamo.reset()
    compiled = torch.compile(topk_then_use, backend="aot_eager", fullgraph=True)  # no graph break, or it raises
    idx, total = compiled(*x)
    want = reference.score_topk(*p.arrays(), 16, return_scores=True)
    np.testing.assert_array_equal(idx.numpy(), want[0])
    np.testing.assert_allclose(total.numpy(), np.where(want[0] >= 0, want[1], 0).sum(axis=1), rtol=1e-6)


def test_bad_input_is_refused_by_name():
    rng = np.random.default_rng(74)
    p = testing.random_problem(rng, T=2, H=8, D=64, E=16, lens=20, top_k=8)
    x = tensors(p)
    with pytest.raises(ValueError, match="top_k"):
        iops.score_topk(*x, 0)
    with pytest.raises(TypeError, match="^q: expected a NumPy dtype"):
        iops.score_topk(x[0].to(torch.float8_e5m2), *x[1:], 8)  # float8_e4m3fn is a query's: e5m2 is not
    with pytest.raises(TypeError, match="^w: expected a NumPy dtype"):  # bfloat16 is a query's dtype only
        iops.score_topk(x[0], x[1].to(torch.bfloat16), *x[2:], 8)
    with pytest.raises(TypeError, match="^w: expected dtype float32"):
        iops.score_topk(x[0], x[1].double(), *x[2:], 8)
    bad = p.valid_lens.copy()
    bad[1] = 10**6
    with pytest.raises(ValueError, match="^valid_lens"):
        iops.score_topk(*x[:6], torch.from_numpy(bad), 8)  # CPU tensors are always validated
    with pytest.raises(ValueError, match="precision"):
        iops.score_topk(*x, 8, precision="fp8")
    with pytest.raises(ValueError, match="^w: expected a tensor on q's device"):  # the dispatcher sends meta
        iops._host_views(ops.score_topk, [x[0], x[1].to("meta"), *x[2:]])      # tensors to the fake kernel
    with pytest.raises(ValueError, match="^device"):
        iops.workspace("cpu")
    # the fake implementation refuses a bad top_k while tracing, before anything runs
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: iops.score_topk(*a, 5000)[0], backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="top_k"):
        compiled(*x)


def test_one_workspace_a_cuda_device():
    # built lazily, no GPU needed to name it; the operators' CUDA calls take it
    ws = iops.workspace(0)
    assert iops.workspace("cuda:0") is ws and iops.workspace(torch.device("cuda", 0)) is ws
    assert iops.workspace(1) is not ws


def test_operator_matches_the_public_call_on_a_saved_problem_layout():
    # the same arrays through the public NumPy call and the operator: identical bits
    rng = np.random.default_rng(75)
    p = testing.adversarial_problem("ties", rng)
    idx, sc = iops.score_topk(*tensors(p), p.top_k)
    want = score_topk(*p.arrays(), p.top_k, backend="numpy", return_scores=True)
    np.testing.assert_array_equal(idx.numpy(), want[0])
    assert sc.numpy().tobytes() == want[1].tobytes()


def test_out_forms_write_the_callers_tensors_in_place():
    rng = np.random.default_rng(77)
    p = testing.random_problem(rng, T=4, H=8, D=64, E=16, lens=[0, 5, 40, 64], top_k=12)
    want = reference.score_topk(*p.arrays(), 12, return_scores=True, physical=True)
    idx, sc = torch.full((4, 12), 7, dtype=torch.int32), torch.full((4, 12), 3.0)
    pointers = (idx.data_ptr(), sc.data_ptr())
    out = (idx, sc)
    assert iops.score_topk(*tensors(p), 12, physical=True, out=out) is out
    assert (idx.data_ptr(), sc.data_ptr()) == pointers
    np.testing.assert_array_equal(idx.numpy(), want[0])
    assert sc.numpy().tobytes() == want[1].tobytes()
    only = torch.zeros((4, 12), dtype=torch.int32)
    assert iops.score_topk(*tensors(p), 12, physical=True, out=only) is only
    np.testing.assert_array_equal(only.numpy(), want[0])
    arrays = grouped_problem(rng, [3, 0, 2, 5], seq_entries=[40, 9, 70, 33], ratio=1)
    grouped = (torch.empty((10, 12), dtype=torch.int32), torch.empty((10, 12)))
    iops.score_topk_ragged(*(torch.from_numpy(a) for a in arrays), 12, out=grouped)
    want = score_topk_ragged(*arrays, 12, backend="numpy", return_scores=True)
    np.testing.assert_array_equal(grouped[0].numpy(), want[0])
    np.testing.assert_array_equal(grouped[1].numpy(), want[1])


def test_torch_library_checks_the_out_forms():
    rng = np.random.default_rng(78)
    p = testing.random_problem(rng, T=3, H=8, D=64, E=16, lens=[50, 0, 17], top_k=12)
    results = (torch.empty((3, 12), dtype=torch.int32), torch.empty((3, 12)))
    torch.library.opcheck(torch.ops.indexer.score_topk_out.default, (*tensors(p), 12, *results, "fast", True, False))
    torch.library.opcheck(torch.ops.indexer.score_topk_out.default, (*tensors(p), 12, results[0], None, "exact",
                                                                     False, False))
    arrays = grouped_problem(rng, [4, 1, 0], ratio=2)
    results = (torch.empty((5, 12), dtype=torch.int32), torch.empty((5, 12)))
    torch.library.opcheck(torch.ops.indexer.score_topk_ragged_out.default,
                          (*(torch.from_numpy(a) for a in arrays), 12, *results, "fast", False, False))


def test_compiled_with_fullgraph_writes_out_in_place():
    rng = np.random.default_rng(79)
    p = testing.random_problem(rng, T=4, H=8, D=64, E=16, lens=[64, 3, 0, 41], top_k=16)

    def layer(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, idx, sc):
        iops.score_topk(q * 1.0, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, 16, out=(idx, sc))
        return (idx >= 0).sum(dim=1)

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    idx, sc = torch.full((4, 16), 5, dtype=torch.int32), torch.zeros((4, 16))
    counts = compiled(*tensors(p), idx, sc)
    want = reference.score_topk(*p.arrays(), 16, return_scores=True)
    np.testing.assert_array_equal(idx.numpy(), want[0])
    np.testing.assert_array_equal(sc.numpy(), want[1])
    np.testing.assert_array_equal(counts.numpy(), (want[0] >= 0).sum(axis=1))


def test_bad_out_is_refused_by_name_and_left_as_it_was():
    rng = np.random.default_rng(80)
    p = testing.random_problem(rng, T=2, H=8, D=64, E=16, lens=20, top_k=8)
    x = tensors(p)
    scores = torch.full((2, 8), 2.5)
    cases = [(torch.zeros((2, 7), dtype=torch.int32), ValueError, "^out: expected int32 of shape"),
             (torch.zeros((2, 8), dtype=torch.int64), TypeError, "^out: expected int32"),
             ((torch.zeros((2, 8), dtype=torch.int32), scores.to(torch.bfloat16)), TypeError, r"^out\[1\]: expected")]
    for out, error, message in cases:
        with pytest.raises(error, match=message):
            iops.score_topk(*x, 8, out=out)
    assert torch.equal(scores, torch.full((2, 8), 2.5))
    with pytest.raises(ValueError, match=r"^out\[1\]: expected a tensor on q's device"):  # the dispatcher sends
        iops._host_out((scores, scores.to("meta")))                                # meta tensors to the fake kernel
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: iops.score_topk(*a[:7], 5000, out=a[7]), backend="aot_eager",
                             fullgraph=True)
    with pytest.raises(Exception, match="top_k"):
        compiled(*x, torch.zeros((2, 5000), dtype=torch.int32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_a_narrow_query_on_the_cpu_is_scored_as_its_float32_values(dtype):
    """NumPy has no bfloat16 or float8: a CPU tensor's values are widened exactly, by the
    operators and by the public call alike, and both give what the float32 values give."""
    p = testing.random_problem(np.random.default_rng(75), T=3, H=8, D=64, E=16, lens=[90, 3, 0], top_k=10)
    x = tensors(p)
    q16 = x[0].to(getattr(torch, dtype))
    want = score_topk(q16.float().numpy(), *p.arrays()[1:], 10, backend="numpy", return_scores=True)
    for got in (iops.score_topk(q16, *x[1:], 10), score_topk(q16, *x[1:], 10, backend="numpy", return_scores=True)):
        np.testing.assert_array_equal(np.asarray(got[0]), want[0])
        assert np.asarray(got[1]).tobytes() == want[1].tobytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_out_overlapping_a_narrow_cpu_query_is_refused_and_the_query_kept(dtype):
    """A bfloat16 or float8 query is read through a widened copy: out= is still checked
    against the caller's tensor itself (before, out was written over q's memory), by the
    public call and the operators, the grouped forms too."""
    p = testing.random_problem(np.random.default_rng(76), T=2, H=4, D=64, E=8, lens=[20, 30], top_k=4)
    x = tensors(p)
    buf = torch.zeros(p.q.size + 64, dtype=torch.int32)  # q's bytes, then room: out starts inside q
    q = buf.view(getattr(torch, dtype))[: p.q.size].view(p.q.shape)
    q.copy_(x[0].to(q.dtype))
    kept = q.view(torch.uint8).clone()
    cu = torch.tensor([0, 2], dtype=torch.int32)
    table, lens = x[5][:1].clone(), torch.tensor([20, 11], dtype=torch.int32)  # both rows within row 0's blocks
    calls = [lambda out: score_topk(q, *x[1:], 4, backend="numpy", out=out.numpy()),
             lambda out: iops.score_topk(q, *x[1:], 4, out=out),
             lambda out: score_topk_ragged(q, *x[1:5], table, cu, lens, 4, backend="numpy", out=out.numpy()),
             lambda out: iops.score_topk_ragged(q, *x[1:5], table, cu, lens, 4, out=out)]
    for call in calls:
        with pytest.raises(ValueError, match="^out: expected memory of its own, got an array overlapping q"):
            call(buf[:8].view(2, 4))
        assert torch.equal(q.view(torch.uint8), kept)
    with pytest.raises(ValueError, match=r"^out\[1\]: expected memory of its own, got an array overlapping q"):
        iops.score_topk(q, *x[1:], 4, out=(torch.zeros((2, 4), dtype=torch.int32), buf[:8].view(torch.float32).view(2, 4)))
    assert torch.equal(q.view(torch.uint8), kept)


def test_a_call_prepared_on_cpu_tensors_gives_the_public_calls_answer():
    """``indexer.prepare`` takes PyTorch host tensors as NumPy arrays are (it refused them)."""
    import indexer  # noqa: PLC0415

    p = testing.random_problem(np.random.default_rng(77), T=3, H=8, D=64, E=16, lens=[90, 0, 33], top_k=10)
    x = tensors(p)
    step = indexer.prepare(*x, 10, return_scores=True, backend="numpy")
    got, want = step(*x), score_topk(*p.arrays(), 10, backend="numpy", return_scores=True)
    assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()


def test_public_calls_take_cpu_tensors_and_refuse_what_numpy_cannot_hold_by_name():
    """The public calls on CPU tensors (the NumPy backend): the grouped call with its table
    and offsets as tensors gives the arrays' answer; a bfloat16 ``w`` (NumPy has none) and a
    sliced bfloat16 query (its widening would copy it into order) are refused by name, as
    their float32 forms are."""
    arrays = grouped_problem(np.random.default_rng(72), [2, 3], seq_entries=[50, 21], ratio=1)
    got = score_topk_ragged(*(torch.from_numpy(a) for a in arrays), 8, backend="numpy", return_scores=True)
    want = score_topk_ragged(*arrays, 8, backend="numpy", return_scores=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])

    p = testing.random_problem(np.random.default_rng(76), T=3, H=8, D=64, E=16, lens=[40, 3, 0], top_k=4)
    x = tensors(p)
    with pytest.raises(TypeError, match=r"^w: expected dtype float32, got torch.bfloat16"):
        score_topk(x[0], x[1].to(torch.bfloat16), *x[2:], 4, backend="numpy")
    scales = x[3].view(torch.float8_e4m3fn)  # the scales' bits as PyTorch's float8: uint8 is asked
    with pytest.raises(TypeError, match=r"^key_scale: expected dtype uint8, got torch.float8_e4m3fn"):
        score_topk(*x[:3], scales, *x[4:], 4, backend="numpy")
    for q in (torch.cat([x[0], x[0]], dim=2)[:, :, ::2], torch.cat([x[0], x[0]], dim=2).to(torch.bfloat16)[:, :, ::2]):
        assert not q.is_contiguous()
        with pytest.raises(ValueError, match=r"^q: expected a C-contiguous array"):
            score_topk(q, *x[1:], 4, backend="numpy")


def write_keys_call(seed):
    """A decode step's keys, slots (with padding) and an empty pool of 8 blocks of 16
    entries (D = 64), as NumPy arrays."""
    from tests.pool_steps import empty_pool, padded_call
    keys, slots, _, _ = padded_call(np.random.default_rng(seed), 64, 16, 8)
    return keys, slots, empty_pool(8, 16, 64)


@pytest.mark.parametrize("key_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_write_keys_operator_writes_the_host_forms_bytes_in_place(key_dtype, slot_dtype):
    import indexer
    keys, slots, pool = write_keys_call(80)
    t_keys = torch.from_numpy(keys).to(key_dtype)
    want = [a.copy() for a in pool]
    indexer.write_keys(t_keys.float().numpy(), slots, *want)
    got = [torch.from_numpy(a.copy()) for a in pool]
    assert iops.write_keys(t_keys, torch.from_numpy(slots).to(slot_dtype), *got) is None
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)


def test_torch_library_checks_the_write_keys_operator():
    keys, slots, pool = write_keys_call(81)
    torch.library.opcheck(torch.ops.indexer.write_keys.default,
                          (torch.from_numpy(keys), torch.from_numpy(slots), *(torch.from_numpy(a) for a in pool), True))


def test_write_keys_compiled_with_fullgraph_writes_the_pool():
    import indexer
    keys, slots, pool = write_keys_call(82)
    want = [a.copy() for a in pool]
    indexer.write_keys(keys * 0.5, slots, *want)

    def step(k, s, keys_fp4, key_scale, key_gscale):
        iops.write_keys(k * 0.5, s, keys_fp4, key_scale, key_gscale)
        return key_gscale.sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)  # no graph break, or it raises
    got = [torch.from_numpy(a.copy()) for a in pool]
    total = compiled(torch.from_numpy(keys), torch.from_numpy(slots), *got)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)
    assert float(total) == float(want[2].sum())


def test_write_keys_operator_refuses_bad_input_by_name_and_writes_nothing():
    keys, slots, pool = write_keys_call(83)
    t = [torch.from_numpy(a.copy()) for a in pool]
    cases = [((torch.from_numpy(keys), torch.from_numpy(slots) + 10**6, *t), ValueError, "^slots: slot"),
             ((torch.from_numpy(keys), torch.from_numpy(slots), t[0], t[1], t[2].double()), TypeError,
              "^key_gscale: expected"),
             ((torch.from_numpy(keys), torch.from_numpy(slots)[:-1], *t), ValueError, r"^slots: expected shape"),
             ((torch.from_numpy(keys).double(), torch.from_numpy(slots), *t), TypeError, "^keys: expected dtype")]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            iops.write_keys(*args)
    for g, w in zip(t, pool):
        np.testing.assert_array_equal(g.numpy(), w)


def test_write_keys_operator_takes_keys_of_any_layout_on_the_cpu():
    """The host form takes keys in any layout, float32 and bfloat16 alike (copied into order)."""
    import indexer
    keys, slots, pool = write_keys_call(84)
    want = [a.copy() for a in pool]
    t = torch.from_numpy(keys).to(torch.bfloat16)
    indexer.write_keys(t.float().numpy(), slots, *want)
    for k in (t.t().contiguous().t(), t.float().t().contiguous().t()):
        assert not k.is_contiguous()
        got = [torch.from_numpy(a.copy()) for a in pool]
        iops.write_keys(k, torch.from_numpy(slots), *got)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w)


@pytest.mark.parametrize("which", ["q", "w", "valid_lens"])
def test_a_meta_tensor_is_refused_by_name(which):
    # a tensor on PyTorch's meta device holds no data: refused naming it, where its
    # conversion to NumPy raised NotImplementedError naming nothing
    p = testing.random_problem(np.random.default_rng(5), T=2, H=4, D=32, E=8, lens=[9, 3], L=2, top_k=3)
    args = dict(zip(testing.ARRAY_NAMES, tensors(p)))
    args[which] = torch.empty(args[which].shape, dtype=args[which].dtype, device="meta")
    with pytest.raises(TypeError, match=f"^{which}: expected a tensor on the host or a CUDA GPU, got one on 'meta'"):
        score_topk(*(args[n] for n in testing.ARRAY_NAMES), 3, backend="numpy")


def _operator_problem():
    p = testing.random_problem(np.random.default_rng(7), T=3, H=8, D=64, E=16, lens=[20, 33, 0], L=3, top_k=5)
    return p, tensors(p)


def _operator_bad_calls(x):
    idx, sc = torch.zeros((3, 5), dtype=torch.int32), torch.zeros((3, 5))
    return [
        # a tensor on the meta device beside CPU ones: the dispatcher takes the fake kernel,
        # which left the results unfilled
        (lambda: iops.score_topk(*x[:6], x[6].to("meta"), 5), ValueError, "^valid_lens: expected a tensor on q's device"),
        (lambda: iops.score_topk(*x[:6], x[6].to("meta"), 5, out=(idx, sc)), ValueError, "^valid_lens: "),
        (lambda: iops.score_topk(torch.tensor(1.0), *x[1:], 5), ValueError, "^q: expected 3 dimensions"),
        (lambda: iops.score_topk(*x, 5, out=(idx,)), TypeError, "^out: expected the indices tensor or a pair"),
        (lambda: iops.score_topk(*x, 5, out=3), TypeError, "^out: expected a tensor"),
        (lambda: iops.score_topk(*x, 5, out=torch._neg_view(idx)), TypeError, "^out: expected a tensor without a lazy "
                                                                              "negation bit"),
        (lambda: iops.score_topk(*x, 5, out=(idx, torch.zeros((3, 5), requires_grad=True))), TypeError,
         r"^out\[1\]: expected a tensor that does not require grad"),
        (lambda: iops.score_topk(x[0], x[1].to_sparse(), *x[2:], 5), TypeError, "^w: expected a plain"),
        (lambda: iops.score_topk(*x, True), TypeError, "^top_k: expected an int"),
        (lambda: iops.score_topk(*x, torch.tensor(5.9)), TypeError, "^top_k: expected an int"),
        (lambda: iops.score_topk(*x, 2**70), ValueError, "^top_k: expected 1 <= top_k"),
        (lambda: iops.score_topk(*x, 5, physical=1), TypeError, "^physical: expected True or False"),
        (lambda: iops.score_topk(*x, 5, validate=None), TypeError, "^validate: expected True or False"),
        (lambda: iops.score_topk(3, *x[1:], 5), TypeError, "^q: expected a tensor"),
        (lambda: iops.score_topk(*x, 5, precision=None), ValueError, "^precision: expected one of"),
    ]


def test_operators_refuse_what_their_schema_would_convert_or_miss_by_name():
    p, x = _operator_problem()
    for call, exc, match in _operator_bad_calls(x):
        with pytest.raises(exc, match=match):
            call()
    # and the same tensors, unchanged, still give the reference's answer
    want = reference.score_topk(*p.arrays(), 5)
    np.testing.assert_array_equal(iops.score_topk(*x, 5)[0].numpy(), want)
    # a lazily negated input is resolved by PyTorch's dispatch before the kernel: -w's answer
    arrays = list(p.arrays())
    arrays[1] = -arrays[1]
    np.testing.assert_array_equal(iops.score_topk(x[0], torch._neg_view(x[1]), *x[2:], 5)[0].numpy(),
                                  reference.score_topk(*arrays, 5))


def test_write_keys_operator_refuses_meta_grad_and_non_tensor_pools_by_name():
    keys, slots, pool = write_keys_call(29)
    t = [torch.from_numpy(a.copy()) for a in pool]
    k, s = torch.from_numpy(keys), torch.from_numpy(slots)
    cases = [((k, s, t[0].to("meta"), t[1], t[2]), ValueError, "^keys: expected a tensor on keys_fp4's device"),
             ((k, s, t[0], t[1], t[2].clone().requires_grad_()), TypeError,
              "^key_gscale: expected a tensor that does not require grad"),
             ((k, s, t[0], t[1], 1.0), TypeError, "^key_gscale: expected a tensor"),
             ((k.to_sparse(), s, *t), TypeError, "^keys: expected a plain")]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            iops.write_keys(*args)
    with pytest.raises(TypeError, match="^validate: expected True or False"):
        iops.write_keys(k, s, *t, validate="no")
    for g, w in zip(t, pool):
        np.testing.assert_array_equal(g.numpy(), w)


def test_a_host_pool_reads_a_negated_view_as_its_values_and_refuses_a_meta_tensor():
    from indexer import KeyPool

    pool = KeyPool(2, entries_per_block=4, head_dim=32)
    with pytest.raises(TypeError, match="^keys: expected a tensor on the host or a CUDA GPU"):
        pool.append("a", torch.empty(3, 32, device="meta"))
    assert pool.sequences == [] and pool.free_blocks == 2
    keys = torch.randn(3, 32)
    pool.append("a", torch._neg_view(keys))  # the host copy resolves the bit: -keys stored
    want = KeyPool(2, entries_per_block=4, head_dim=32)
    want.append("a", (-keys).numpy())
    for name in ("keys_fp4", "key_scale", "key_gscale"):
        np.testing.assert_array_equal(getattr(pool, name), getattr(want, name))


def test_the_numpy_backend_reads_negated_views_as_their_values():
    p = testing.random_problem(np.random.default_rng(3), T=2, H=4, D=32, E=8, lens=[9, 3], L=2, top_k=3)
    x = tensors(p)
    arrays = list(p.arrays())
    arrays[1] = -arrays[1]
    np.testing.assert_array_equal(score_topk(x[0], torch._neg_view(x[1]), *x[2:], 3, backend="numpy"),
                                  reference.score_topk(*arrays, 3))
    qb = x[0].to(torch.bfloat16)
    arrays = list(p.arrays())
    arrays[0] = -qb.float().numpy()
    np.testing.assert_array_equal(score_topk(torch._neg_view(qb), *x[1:], 3, backend="numpy"),
                                  reference.score_topk(*arrays, 3))


def test_operators_take_numpy_integer_top_k_and_pass_their_own_errors_on(monkeypatch):
    p, x = _operator_problem()
    want = reference.score_topk(*p.arrays(), 5)
    for k in (np.int64(5), np.int32(5)):
        np.testing.assert_array_equal(iops.score_topk(*x, k)[0].numpy(), want)

    def fails(*args, **kwargs):
        raise RuntimeError("an error of the call's own")

    # an input that requires grad is detached by the operator: an error inside the call is
    # passed on as it is, not renamed as the input's gradient
    monkeypatch.setattr(ops, "score_topk", fails)
    monkeypatch.setattr(iops.ops, "score_topk", fails)
    w = x[1].clone().requires_grad_()
    with pytest.raises(RuntimeError, match="an error of the call's own"):
        iops._call(fails, [x[0], w, *x[2:]], 5, "fast", False, False)


def test_a_torch_object_that_is_no_tensor_is_refused_by_name():
    p = testing.random_problem(np.random.default_rng(3), T=2, H=4, D=32, E=8, lens=[9, 3], L=2, top_k=3)
    args = list(p.arrays())
    args[6] = torch.Size([9, 3])
    with pytest.raises(TypeError, match="^valid_lens: expected an array or a tensor, got Size"):
        score_topk(*args, 3, backend="numpy")
