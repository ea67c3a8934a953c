"""Queries grouped by sequence (score_topk_ragged, causal_lens, KeyPool grouping) on the CPU."""

import numpy as np
import pytest

import indexer
from indexer import KeyPool, ragged, reference, testing


def grouped_problem(rng, counts, *, H=8, D=64, E=16, seq_entries=None, top_k=12, ratio=None):
    """B sequences with `counts` query rows each; per-sequence block tables (B, L)."""
    B = len(counts)
    seq_entries = seq_entries or [int(rng.integers(1, 5 * E)) for _ in range(B)]
    L = max(1, max(-(-n // E) for n in seq_entries))
    P = B * L + 3
    base = testing.random_problem(rng, T=1, H=H, D=D, E=E, lens=1, top_k=top_k, P=P, L=L)
    perm = rng.permutation(P).astype(np.int32)
    table = perm[: B * L].reshape(B, L).copy()
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    T = int(cu[-1])
    if ratio is None:
        lens = np.concatenate([rng.integers(0, n + 1, size=c) for n, c in zip(seq_entries, counts)]).astype(np.int32)
    else:
        lens = np.minimum(indexer.causal_lens(cu, ratio=ratio), np.repeat(seq_entries, counts)).astype(np.int32)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    w = rng.standard_normal((T, H)).astype(np.float32)
    return q, w, base.keys_fp4, base.key_scale, base.key_gscale, table, cu, lens


def as_problem(q, w, k, s, g, table, cu, lens, top_k):
    per_token = np.repeat(table, np.diff(cu), axis=0)
    return testing.Problem(q, w, k, s, g, np.ascontiguousarray(per_token), lens, top_k)


@pytest.mark.parametrize("counts", [[3, 1, 4], [1], [0, 5, 0, 2], [7, 0]])
def test_ragged_equals_per_token_reference(counts):
    rng = np.random.default_rng(sum(counts) * 7 + len(counts))
    args = grouped_problem(rng, counts)
    got, sc = indexer.score_topk_ragged(*args, 12, backend="numpy", return_scores=True)
    p = as_problem(*args, 12)
    want, want_sc = reference.score_topk(*p.args(), return_scores=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sc, want_sc)
    testing.check_topk(p, got, sc)
    np.testing.assert_array_equal(reference.score_topk_ragged(*args, 12), want)


def test_physical_indices_use_the_sequence_table():
    rng = np.random.default_rng(3)
    args = grouped_problem(rng, [2, 3])
    got = indexer.score_topk_ragged(*args, 12, backend="numpy", physical=True)
    p = as_problem(*args, 12)
    testing.check_topk(p, got, physical=True)


def test_expand_and_sequence_of_token():
    cu = np.array([0, 2, 2, 5], dtype=np.int32)
    np.testing.assert_array_equal(ragged.sequence_of_token(cu, 5), [0, 0, 2, 2, 2])
    table = np.arange(6, dtype=np.int32).reshape(3, 2)
    np.testing.assert_array_equal(ragged.expand_block_table(table, cu, 5), table[[0, 0, 2, 2, 2]])
    # malformed offsets (validation off) still index inside the table
    bad = np.array([0, 9, 1, 5], dtype=np.int32)
    seq = ragged.sequence_of_token(bad, 5)
    assert seq.min() >= 0 and seq.max() <= 2


@pytest.mark.parametrize("ratio", [1, 4, 7])
def test_causal_lens_formula(ratio):
    cu = np.array([0, 5, 5, 12], dtype=np.int32)
    context = np.array([0, 3, 100])
    got = indexer.causal_lens(cu, ratio=ratio, context_lens=context)
    want = []
    for b in range(3):
        for i in range(cu[b + 1] - cu[b]):
            want.append((context[b] + i + 1) // ratio)
    np.testing.assert_array_equal(got, np.array(want, dtype=np.int32))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(indexer.causal_lens(cu, ratio=ratio),
                                  indexer.causal_lens(cu, ratio=ratio, context_lens=np.zeros(3, np.int64)))


def test_prefill_chunk_lengths_match_the_benchmark_definition():
    cu = np.array([0, 4096], dtype=np.int32)
    got = indexer.causal_lens(cu, ratio=4, context_lens=np.array([1 << 20]))
    t = np.arange(4096)
    np.testing.assert_array_equal(got, 262_144 + (t + 1) // 4)


@pytest.mark.parametrize("bad,exc,match", [
    (dict(ratio=0), ValueError, "^ratio: expected a positive int, got 0"),
    (dict(ratio=2.0), TypeError, "^ratio: expected a positive int, got float"),  # a wrong type: TypeError
    (dict(ratio=True), TypeError, "^ratio: expected a positive int, got bool"),
    (dict(context_lens=np.array([1, 2])), ValueError, "context_lens: expected shape"),
    (dict(context_lens=np.array([-1, 0, 0])), ValueError, "context_lens: expected values >= 0"),
])
def test_causal_lens_rejects_bad_arguments(bad, exc, match):
    with pytest.raises(exc, match=match):
        indexer.causal_lens(np.array([0, 1, 1, 2], dtype=np.int32), **bad)


def test_causal_lens_of_no_sequence_takes_an_empty_context_list():
    """B = 0: ``context_lens=[]`` (which NumPy makes float64) is the one valid list, not refused."""
    lens = indexer.causal_lens(np.array([0], np.int32), context_lens=[])
    assert lens.dtype == np.int32 and lens.shape == (0,)


@pytest.mark.parametrize("cu,kw,exc,match", [
    (np.array([2, 5]), {}, ValueError, "cu_seqlens_q: expected offsets from 0"),
    (np.array([0, 5, 3]), {}, ValueError, "cu_seqlens_q: expected non-decreasing"),
    (np.array([0, 2**31]), {}, ValueError, "cu_seqlens_q: expected offsets from 0 to T < 2"),
    (np.array([0, 3.5, 8]), {}, TypeError, "cu_seqlens_q: expected integers"),
    ("0, 4", {}, TypeError, "cu_seqlens_q: expected a NumPy or CuPy array, a list or a tensor, got str"),
    (np.int32(3), {}, TypeError, "cu_seqlens_q: expected a NumPy or CuPy array"),
    ([0, [4]], {}, TypeError, "cu_seqlens_q: expected an array, got a list that is not one"),
    (np.zeros((2, 2), np.int32), {}, ValueError, r"cu_seqlens_q: expected shape \(B\+1,\)"),
    (np.array([0, 3]), dict(context_lens=np.array([2**63 - 1])), ValueError, "context_lens: visible lengths exceed"),
    (np.array([0, 3]), dict(context_lens=np.array([2**64 - 1], np.uint64), ratio=2**40), ValueError,
     "context_lens: visible lengths exceed"),
    (np.array([0, 3]), dict(context_lens=[1.5]), TypeError, "context_lens: expected integers"),
])
def test_causal_lens_rejects_bad_offsets_and_context(cu, kw, exc, match):
    with pytest.raises(exc, match=match):
        indexer.causal_lens(cu, **kw)


def test_causal_lens_takes_lists_and_pytorch_host_tensors_as_numpy_arrays():
    """Offsets as a list or a PyTorch CPU tensor (``context_lens`` took both already): the
    NumPy array's lengths, as a NumPy array (host tensors in, NumPy out, as the scoring calls)."""
    want = indexer.causal_lens(np.array([0, 4, 6], np.int32), ratio=2, context_lens=np.array([3, 0]))
    got = indexer.causal_lens([0, 4, 6], ratio=2, context_lens=[3, 0])
    assert isinstance(got, np.ndarray) and got.dtype == np.int32 and (got == want).all()
    assert (want == [2, 2, 3, 3, 0, 1]).all()
    torch = pytest.importorskip("torch")
    got = indexer.causal_lens(torch.tensor([0, 4, 6], dtype=torch.int32), ratio=2, context_lens=torch.tensor([3, 0]))
    assert isinstance(got, np.ndarray) and (got == want).all()
    with pytest.raises(TypeError, match="^cu_seqlens_q: expected a plain"):
        indexer.causal_lens(torch.tensor([0, 4]).to_sparse())


def test_causal_prefill_rows_shorter_than_k_are_padded():
    rng = np.random.default_rng(4)
    args = grouped_problem(rng, [40], seq_entries=[10], ratio=4, top_k=8)
    got, sc = indexer.score_topk_ragged(*args, 8, backend="numpy", return_scores=True)
    lens = args[-1]
    assert (got[lens == 0] == -1).all() and np.isneginf(sc[lens == 0]).all()
    testing.check_topk(as_problem(*args, 8), got, sc)


@pytest.mark.parametrize("mutate,match", [
    (lambda a: a.__setitem__(6, a[6].astype(np.int64)), "cu_seqlens_q: expected dtype int32"),
    (lambda a: a.__setitem__(6, a[6][:-1]), r"cu_seqlens_q: expected shape \(3,\)"),
    (lambda a: a.__setitem__(6, a[6] + 1), "cu_seqlens_q: expected offsets from 0"),
    (lambda a: a.__setitem__(6, np.array([0, 5, 5], dtype=np.int32)), "cu_seqlens_q: expected offsets from 0 to T"),
    (lambda a: a.__setitem__(6, np.array([0, 5, 3], dtype=np.int32)), "cu_seqlens_q: expected offsets from 0 to T|non-decreasing"),
    (lambda a: a.__setitem__(5, a[5][:, :, None]), "block_table: expected 2 dimensions"),
    (lambda a: a.__setitem__(5, a[5][:0]), r"cu_seqlens_q: expected shape \(1,\)"),
    (lambda a: a.__setitem__(5, np.ascontiguousarray(a[5][:, :0])), r"block_table: expected at least one column, got shape \(2, 0\)"),
    (lambda a: a.__setitem__(6, [0, 2, 3]), "cu_seqlens_q: expected a NumPy or CuPy array"),
])
@pytest.mark.parametrize("validate", [True, False])  # the NumPy backend always checks values
def test_ragged_validation_names_the_argument(mutate, match, validate):
    rng = np.random.default_rng(5)
    args = list(grouped_problem(rng, [2, 1]))
    mutate(args)
    with pytest.raises((ValueError, TypeError), match=match):
        indexer.score_topk_ragged(*args, 4, backend="numpy", validate=validate)


def test_bad_block_id_is_named_by_the_callers_row():
    """A grouped call's block-id error names the row of the caller's (B, L) table (the
    sequence), not the per-token table it was expanded to."""
    rng = np.random.default_rng(12)
    args = list(grouped_problem(rng, [2, 1], seq_entries=[20, 20]))
    args[5][1, 0] = args[2].shape[0] + 5  # sequence 1's first block: read by query row 2
    args[7][:] = 20
    with pytest.raises(ValueError, match=r"got \d+ at row 1 \(for query row 2\), logical block 0"):
        indexer.score_topk_ragged(*args, 4, backend="numpy")


def test_decreasing_offsets_are_rejected():
    rng = np.random.default_rng(6)
    args = list(grouped_problem(rng, [2, 1, 0]))
    args[6] = np.array([0, 2, 1, 3], dtype=np.int32)
    with pytest.raises(ValueError, match="non-decreasing"):
        indexer.score_topk_ragged(*args, 4, backend="numpy")


def test_zero_sequences_is_rejected():
    rng = np.random.default_rng(7)
    args = list(grouped_problem(rng, [1]))
    args[5] = args[5][:0]
    args[6] = np.array([0], dtype=np.int32)
    # no sequence: no offsets can reach T >= 1 (the GPU path, which checks values later,
    # names the table)
    with pytest.raises(ValueError, match="^cu_seqlens_q: expected offsets from 0 to T = 1"):
        indexer.score_topk_ragged(*args, 4, backend="numpy")


def test_pool_grouping_matches_the_ragged_call():
    rng = np.random.default_rng(8)
    pool = KeyPool(40, entries_per_block=16, head_dim=64)
    pool.append("a", rng.standard_normal((70, 64)).astype(np.float32))
    pool.append("b", rng.standard_normal((33, 64)).astype(np.float32))
    cu = np.array([0, 3, 5], dtype=np.int32)
    q = rng.standard_normal((5, 8, 64)).astype(np.float32)
    w = rng.standard_normal((5, 8)).astype(np.float32)
    lens = indexer.causal_lens(cu, ratio=1, context_lens=np.array([60, 30]))
    got = pool.score_topk(q, w, ["a", "b"], 10, cu_seqlens_q=cu, valid_lens=lens, backend="numpy")
    want = indexer.score_topk_ragged(q, w, pool.keys_fp4, pool.key_scale, pool.key_gscale,
                                     pool.block_table(["a", "b"]), cu, lens, 10, backend="numpy")
    np.testing.assert_array_equal(got, want)
    # default: every row sees its whole sequence
    full = pool.score_topk(q, w, ["a", "b"], 10, cu_seqlens_q=cu, backend="numpy")
    np.testing.assert_array_equal(full, pool.score_topk(q, w, ["a", "a", "a", "b", "b"], 10, backend="numpy"))


def test_pool_grouping_errors():
    rng = np.random.default_rng(9)
    pool = KeyPool(4, entries_per_block=16, head_dim=64)
    pool.append(0, rng.standard_normal((20, 64)).astype(np.float32))
    q = rng.standard_normal((2, 8, 64)).astype(np.float32)
    w = rng.standard_normal((2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="valid_lens: only taken together with cu_seqlens_q"):
        pool.score_topk(q, w, [0, 0], 4, valid_lens=np.array([1, 2], np.int32), backend="numpy")
    # the offsets are checked before they size the rows' lengths
    for cu, exc, match in [(np.array([0, 1, 2], np.int32), ValueError, r"cu_seqlens_q: expected shape \(2,\)"),
                           (np.array([0, 2**31 - 1], np.int32), ValueError, "cu_seqlens_q: expected offsets from 0 to T = 2"),
                           (np.array([0, 3, 2], np.int32), ValueError, r"cu_seqlens_q: expected shape \(2,\)"),
                           (np.int32(2), ValueError, "cu_seqlens_q: expected 1 dimensions"),
                           ("ab", TypeError, "cu_seqlens_q: expected dtype int32")]:
        with pytest.raises(exc, match=match):
            pool.score_topk(q, w, [0], 4, cu_seqlens_q=cu, backend="numpy")
    for bad_q in (q.tolist(), np.float32(1), None):  # q is checked before its rows are counted
        with pytest.raises(TypeError, match="q: expected a NumPy or CuPy array"):
            pool.score_topk(bad_q, w, [0], 4, cu_seqlens_q=np.array([0, 2], np.int32), backend="numpy")
        with pytest.raises(TypeError, match="q: expected a NumPy or CuPy array"):
            indexer.score_topk_ragged(bad_q, w, pool.keys_fp4, pool.key_scale, pool.key_gscale, pool.block_table([0]),
                                      np.array([0, 2], np.int32), np.array([5, 6], np.int32), 4, backend="numpy")


def test_offsets_past_the_rows_are_clamped_into_the_table():
    """Malformed offsets (validation off) leave every row on a row of the table."""
    out = ragged.expand_block_table(np.array([[5, 6]], np.int32), np.array([0, 2], np.int32), 4)
    assert out.tolist() == [[5, 6]] * 4
