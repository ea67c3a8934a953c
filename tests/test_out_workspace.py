"""out=, workspace= and stream= on the NumPy backend (CPU): out arrays are filled and returned
as themselves, bad ones are refused naming the argument, a workspace and a stream are
checked and then ignored (there is no device memory or stream on the host)."""

import numpy as np
import pytest

import indexer
from indexer import KeyPool, arrays, outbuf, reference, streams, testing, workspace as workspace_mod
from tests.gpu import in_one_buffer


def problem(rng, T=4, top_k=10):
    return testing.random_problem(rng, T=T, H=8, D=64, E=16, L=3, top_k=top_k)


def both_calls_raise(p, error, pattern, **keyword):
    """score_topk and score_topk_ragged (one sequence of all of p's rows) on the NumPy
    backend both raise ``error`` matching ``pattern`` for the bad ``keyword``."""
    with pytest.raises(error, match=pattern):
        indexer.score_topk(*p.args(), backend="numpy", **keyword)
    cu = np.array([0, p.q.shape[0]], dtype=np.int32)
    with pytest.raises(error, match=pattern):
        indexer.score_topk_ragged(p.q, p.w, p.keys_fp4, p.key_scale, p.key_gscale, p.block_table[:1], cu,
                                  p.valid_lens, p.top_k, backend="numpy", **keyword)


def empty_out(p, scores=False):
    idx = np.full((p.q.shape[0], p.top_k), -7, dtype=np.int32)
    if not scores:
        return idx
    return idx, np.full((p.q.shape[0], p.top_k), 7.0, dtype=np.float32)


# ----------------------------------------------------------------------------- out=


def test_out_indices_is_returned_and_filled(rng):
    p = problem(rng)
    out = empty_out(p)
    result = indexer.score_topk(*p.args(), backend="numpy", out=out)
    assert result is out
    np.testing.assert_array_equal(out, reference.score_topk(*p.args()))


def test_out_pair_is_returned_and_filled(rng):
    p = problem(rng)
    out = empty_out(p, scores=True)
    result = indexer.score_topk(*p.args(), backend="numpy", return_scores=True, physical=True, out=out)
    assert result is out
    idx, sc = reference.score_topk(*p.args(), return_scores=True, physical=True)
    np.testing.assert_array_equal(out[0], idx)
    assert out[1].tobytes() == sc.tobytes()


def test_out_list_pair_returns_a_tuple_of_the_same_arrays(rng):
    p = problem(rng)
    out = list(empty_out(p, scores=True))
    result = indexer.score_topk(*p.args(), backend="numpy", return_scores=True, out=out)
    assert isinstance(result, tuple) and result[0] is out[0] and result[1] is out[1]
    testing.check_topk(p, *result)


def test_out_ragged_and_key_pool(rng):
    p = problem(rng, T=3)
    cu = np.array([0, 2, 3], dtype=np.int32)
    table = p.block_table[:2].copy()
    table[:, :] = np.arange(3, dtype=np.int32)
    out = empty_out(p, scores=True)
    result = indexer.score_topk_ragged(p.q, p.w, p.keys_fp4, p.key_scale, p.key_gscale, table, cu, p.valid_lens,
                                       p.top_k, backend="numpy", return_scores=True, out=out)
    assert result is out
    expected = indexer.score_topk_ragged(p.q, p.w, p.keys_fp4, p.key_scale, p.key_gscale, table, cu,
                                         p.valid_lens, p.top_k, backend="numpy", return_scores=True)
    np.testing.assert_array_equal(out[0], expected[0])
    np.testing.assert_array_equal(out[1], expected[1])

    pool = KeyPool(8, entries_per_block=16, head_dim=64)
    pool.append("a", rng.standard_normal((40, 64)).astype(np.float32))
    pool.append("b", rng.standard_normal((7, 64)).astype(np.float32))
    q = rng.standard_normal((2, 8, 64)).astype(np.float32)
    w = rng.standard_normal((2, 8)).astype(np.float32)
    out = np.empty((2, 5), dtype=np.int32)
    ws = indexer.Workspace()
    # the NumPy backend named: on a machine with a GPU, 'auto' would take the CUDA path
    assert pool.score_topk(q, w, ["a", "b"], 5, out=out, workspace=ws, backend="numpy") is out
    np.testing.assert_array_equal(out, pool.score_topk(q, w, ["a", "b"], 5, backend="numpy"))
    assert ws.nbytes == 0  # the NumPy backend takes no workspace memory
    cu = np.array([0, 2], dtype=np.int32)
    assert pool.score_topk(q, w, ["a"], 5, cu_seqlens_q=cu, out=out, backend="numpy") is out


def test_out_leaves_other_rows_alone_and_overwrites_every_entry(rng):
    # every entry of out is written (padding too): nothing of the old contents survives
    p = testing.random_problem(rng, T=3, H=4, D=32, E=8, lens=[0, 3, 40], L=5, top_k=12)
    out = empty_out(p, scores=True)
    indexer.score_topk(*p.args(), backend="numpy", return_scores=True, out=out)
    assert np.all(out[0][0] == -1) and np.all(np.isneginf(out[1][0]))
    assert np.all(out[0][1, 3:] == -1)
    assert not np.any(out[0] == -7) and not np.any(out[1] == 7.0)


def bad_outs(p):
    T, k = p.q.shape[0], p.top_k
    idx = np.zeros((T, k), dtype=np.int32)
    sc = np.zeros((T, k), dtype=np.float32)
    read_only = idx.copy()
    read_only.flags.writeable = False
    return [
        ("int64", dict(out=np.zeros((T, k), dtype=np.int64)), TypeError, r"^out: expected int32 of shape \(T, top_k\)"),
        ("shape", dict(out=np.zeros((T, k + 1), dtype=np.int32)), ValueError, r"^out: expected int32 of shape \(T, top_k\) = "),
        ("transposed", dict(out=np.zeros((k, T), dtype=np.int32).T), ValueError, "^out: expected a C-contiguous"),
        ("read-only", dict(out=read_only), ValueError, "^out: expected a writeable"),
        ("str", dict(out="indices"), TypeError, "^out: expected a NumPy array"),
        ("pair without scores", dict(out=(idx, sc)), TypeError, "^out: expected one int32"),
        ("single with scores", dict(out=idx, return_scores=True), TypeError, r"^out: expected a pair \(indices, scores\)"),
        ("triple", dict(out=(idx, sc, sc), return_scores=True), TypeError, "^out: expected a pair"),
        ("scores int32", dict(out=(idx, idx.copy()), return_scores=True), TypeError, "^out\\[1\\]: expected float32"),
        ("indices float", dict(out=(sc.copy(), sc), return_scores=True), TypeError, "^out\\[0\\]: expected int32"),
    ]


@pytest.mark.parametrize("case", range(10))
def test_bad_out_names_the_argument(rng, case):
    p = problem(rng)
    name, kwargs, error, pattern = bad_outs(p)[case]
    with pytest.raises(error, match=pattern):
        indexer.score_topk(*p.args(), backend="numpy", **kwargs)


def test_bad_inputs_are_reported_before_out(rng):
    p = problem(rng)
    args = list(p.args())
    args[-1] = 0  # top_k
    with pytest.raises(ValueError, match="^top_k"):
        indexer.score_topk(*args, backend="numpy", out="not an array")


def test_out_split_and_returned():
    a, b = np.zeros(1), np.zeros(1)
    assert outbuf.split(a, False) == (a, None)
    assert outbuf.split((a, b), True) == (a, b)
    assert outbuf.returned([a, b], True) == (a, b)
    t = (a, b)
    assert outbuf.returned(t, True) is t
    with pytest.raises(TypeError, match="a list of 1"):
        outbuf.split([a], True)


NAMES = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens")


@pytest.mark.parametrize("which", range(7))
def test_out_overlapping_an_input_is_refused_and_the_input_kept(rng, which):
    p = problem(rng)
    T, k = p.q.shape[0], p.top_k
    args = list(p.args())
    args[which], out = in_one_buffer(args[which], T, k, overlap=True)
    kept = args[which].copy()
    out_before = out.copy()
    with pytest.raises(ValueError, match=f"^out: expected memory of its own, got an array overlapping {NAMES[which]}$"):
        indexer.score_topk(*args, backend="numpy", out=out)
    np.testing.assert_array_equal(args[which], kept)
    np.testing.assert_array_equal(out, out_before)
    # the same buffer, out just past the input: accepted and filled
    args[which], out = in_one_buffer(p.args()[which], T, k, overlap=False)
    assert indexer.score_topk(*args, backend="numpy", out=out) is out
    np.testing.assert_array_equal(out, reference.score_topk(*p.args()))
    np.testing.assert_array_equal(args[which], p.args()[which])


def test_out_pair_overlapping_itself_or_an_input_is_refused(rng):
    p = problem(rng)
    T, k = p.q.shape[0], p.top_k
    raw = np.empty(T * k, dtype=np.int32)
    with pytest.raises(ValueError, match="^out\\[1\\]: expected memory of its own, got an array overlapping out\\[0\\]$"):
        indexer.score_topk(*p.args(), backend="numpy", return_scores=True, out=(raw.reshape(T, k), raw.view(np.float32).reshape(T, k)))
    args = list(p.args())
    args[1], scores_raw = in_one_buffer(p.w, T, k, overlap=True)
    with pytest.raises(ValueError, match="^out\\[1\\]: expected memory of its own, got an array overlapping w$"):
        indexer.score_topk(*args, backend="numpy", return_scores=True, out=(raw.reshape(T, k), scores_raw.view(np.float32)))
    np.testing.assert_array_equal(args[1], p.w)


@pytest.mark.parametrize("which", ["block_table", "cu_seqlens_q"])
def test_ragged_out_overlapping_its_groups_is_refused(rng, which):
    p = problem(rng, T=3)
    T, k = 3, p.top_k
    table = np.tile(np.arange(p.block_table.shape[1], dtype=np.int32), (2, 1))  # every block valid
    grouped = dict(block_table=table, cu_seqlens_q=np.array([0, 2, 3], dtype=np.int32))
    grouped[which], out = in_one_buffer(grouped[which], T, k, overlap=True)
    kept = grouped[which].copy()
    with pytest.raises(ValueError, match=f"^out: expected memory of its own, got an array overlapping {which}$"):
        indexer.score_topk_ragged(p.q, p.w, p.keys_fp4, p.key_scale, p.key_gscale, grouped["block_table"],
                                  grouped["cu_seqlens_q"], p.valid_lens, k, backend="numpy", out=out)
    np.testing.assert_array_equal(grouped[which], kept)


def test_byte_extent_and_check_apart_extents():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    base = a.__array_interface__["data"][0]
    assert arrays.byte_extent(a) == (base, base + 48)
    assert arrays.byte_extent(a[::-1, ::2]) == (base, base + 44)  # reversed rows, every other column
    assert arrays.byte_extent(a[:, 1:2]) == (base + 4, base + 40)
    assert arrays.byte_extent(a[:0]) is None and arrays.byte_extent([1, 2]) is None
    outbuf.check_apart_extents([("out", (10, 20))], [("q", (0, 10)), ("w", (20, 30)), ("x", None)])
    outbuf.check_apart_extents([("out", None)], [("q", (0, 100))])
    for other in ((19, 21), (0, 11), (12, 13), (5, 25)):
        with pytest.raises(ValueError, match="^out: expected memory of its own, got an array overlapping q$"):
            outbuf.check_apart_extents([("out", (10, 20))], [("q", other)])


# ----------------------------------------------------------------------------- workspace=


def test_workspace_on_the_numpy_backend_is_accepted_and_ignored(rng):
    p = problem(rng)
    ws = indexer.Workspace()
    got = indexer.score_topk(*p.args(), backend="numpy", workspace=ws)
    np.testing.assert_array_equal(got, reference.score_topk(*p.args()))
    assert ws.nbytes == 0
    assert repr(ws) == "Workspace(nbytes=0, devices=[])"


@pytest.mark.parametrize("bad", ["ws", 123, object()])
def test_bad_workspace_names_the_argument(rng, bad):
    both_calls_raise(problem(rng), TypeError, "^workspace: expected an indexer.Workspace", workspace=bad)


@pytest.mark.parametrize("nbytes,device,error,pattern", [
    (1.5, None, TypeError, "^nbytes: expected an int"),
    (True, None, TypeError, "^nbytes"),
    (-1, None, ValueError, "^nbytes: expected an int >= 0"),
    (10, "0", TypeError, "^device: expected a CUDA device number"),
    (10, -1, ValueError, "^device: expected a CUDA device number >= 0"),
])
def test_workspace_reserve_checks_its_arguments(nbytes, device, error, pattern):
    with pytest.raises(error, match=pattern):
        indexer.Workspace().reserve(nbytes, device=device)


def test_workspace_reserve_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(arrays, "cupy", lambda: None)
    ws = indexer.Workspace()
    with pytest.raises(RuntimeError, match="needs CuPy and a CUDA GPU"):
        ws.reserve(1 << 20)
    assert ws.nbytes == 0


def test_check_workspace():
    ws = indexer.Workspace()
    assert workspace_mod.check_workspace(ws) is ws
    assert workspace_mod.check_workspace(None) is None


# ----------------------------------------------------------------------------- stream=


class _FakeTorchStream:
    """Looks like a torch.cuda.Stream to the duck-typed check (module 'torch...')."""

    cuda_stream = 1234


_FakeTorchStream.__module__ = "torch.cuda.streams"


class _FakeCupyStream:
    ptr = 5


_FakeCupyStream.__module__ = "cupy.cuda.stream"


class _ProtocolStream:
    def __cuda_stream__(self):
        return (0, 99)


def test_check_stream_kinds():
    assert streams.check_stream(None) is None
    assert streams.check_stream(0) == "int"
    assert streams.check_stream(2**40) == "int"
    assert streams.check_stream(_FakeTorchStream()) == "torch"
    assert streams.check_stream(_FakeCupyStream()) == "cupy"
    assert streams.check_stream(_ProtocolStream()) == "protocol"


@pytest.mark.parametrize("bad,error,pattern", [
    (True, TypeError, "^stream: expected a CuPy stream.*got bool"),
    (-3, ValueError, r"^stream: expected a cudaStream_t pointer \(0 to 2\*\*64 - 1\)"),
    (2**64, ValueError, r"^stream: expected a cudaStream_t pointer \(0 to 2\*\*64 - 1\)"),
    ("default", TypeError, "^stream: expected a CuPy stream.*got str"),
    (1.0, TypeError, "^stream"),
])
def test_bad_stream_names_the_argument(rng, bad, error, pattern):
    both_calls_raise(problem(rng), error, pattern, stream=bad)


def test_stream_on_the_numpy_backend_is_ignored(rng):
    p = problem(rng)
    got = indexer.score_topk(*p.args(), backend="numpy", stream=0)
    np.testing.assert_array_equal(got, reference.score_topk(*p.args()))
    got = indexer.score_topk(*p.args(), backend="numpy", stream=_FakeTorchStream())
    np.testing.assert_array_equal(got, reference.score_topk(*p.args()))


def test_ragged_with_no_sequences_is_refused(rng):
    p = problem(rng)
    empty = np.zeros((0, 3), dtype=np.int32)
    cu = np.zeros(1, dtype=np.int32)
    with pytest.raises(ValueError, match="^(block_table|cu_seqlens_q)"):
        indexer.score_topk_ragged(p.q, p.w, p.keys_fp4, p.key_scale, p.key_gscale, empty, cu, p.valid_lens,
                                  p.top_k, backend="numpy", validate=False)


# ----------------------------------------------------------------------------- workspace_budget=


@pytest.mark.parametrize("bad,error,pattern", [
    (1.5, TypeError, "^workspace_budget: expected an int"),
    (True, TypeError, "^workspace_budget: expected an int"),
    ("64M", TypeError, "^workspace_budget: expected an int"),
    (0, ValueError, "^workspace_budget: expected a positive number of bytes, got 0"),
    (-5, ValueError, "^workspace_budget: expected a positive number of bytes"),
])
def test_bad_workspace_budget_names_the_argument(rng, bad, error, pattern):
    both_calls_raise(problem(rng), error, pattern, workspace_budget=bad)


def test_workspace_budget_on_the_numpy_backend_is_accepted_and_ignored(rng):
    p = problem(rng)
    for budget in (None, 1, np.int64(1 << 30)):
        got = indexer.score_topk(*p.args(), backend="numpy", workspace_budget=budget)
        np.testing.assert_array_equal(got, reference.score_topk(*p.args()))
    assert workspace_mod.check_budget(np.int64(7)) == 7 and workspace_mod.check_budget(None) is None


def test_a_workspace_turn_without_cupy_says_so(monkeypatch):
    monkeypatch.setattr(arrays, "cupy", lambda: None)
    with pytest.raises(RuntimeError, match="^Workspace.turn: needs CuPy and a CUDA GPU"):
        indexer.Workspace().turn()
