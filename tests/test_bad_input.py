"""The bad-input catalogue: every malformed input the API or the CLI can be handed gives a
clear error naming the problem, never a crash, and leaves the user's data unchanged.

API entries must raise ValueError/TypeError (RuntimeError for a full pool) whose message
starts with the argument's name; CLI entries must exit non-zero with one line starting
with "error:" and no traceback. Validation is shared by the NumPy and CUDA backends
(indexer.validate), so these run on the CPU.
"""

import copy
import json
import pickle
import zipfile

import numpy as np
import pytest
from cli_runner import separate_runner

import indexer
from indexer import KeyPool, cli, io, nvfp4, testing
from indexer.pool import PoolFullError

RNG_SEED = 123


def problem():
    return testing.random_problem(np.random.default_rng(RNG_SEED), T=3, H=8, D=64, E=16, lens=[20, 33, 0],
                                  L=3, top_k=5)


# the arrays every catalogue call passes where it replaces nothing: the test below checks
# that no failed call changed them
SHARED = problem()


def call_with(**changes):
    """score_topk on the reference backend with some arguments replaced (the others SHARED's)."""
    p = SHARED
    args = dict(zip(testing.ARRAY_NAMES, p.arrays()), top_k=p.top_k)
    args.update(changes)
    kw = {k: args.pop(k) for k in ("backend", "precision", "out", "workspace", "stream", "return_scores") if k in args}
    return lambda: indexer.score_topk(*[args[n] for n in testing.ARRAY_NAMES], args["top_k"],
                                      backend=kw.get("backend", "numpy"), **{k: v for k, v in kw.items() if k != "backend"})


def with_gscale(value):
    g = problem().key_gscale.copy()
    g[1] = value
    return call_with(key_gscale=g)


def with_block(row, col, value):
    bt = problem().block_table.copy()
    bt[row, col] = value
    return call_with(block_table=bt)


def with_lens(values):
    return call_with(valid_lens=np.array(values, dtype=np.int32))


def ragged_decreasing():
    p = problem()
    table = p.block_table[:2].copy()
    table[:, 2] = 0
    cu = np.array([0, 3, 2], dtype=np.int32)
    return lambda: indexer.score_topk_ragged(p.q, p.w, p.keys_fp4, p.key_scale, p.key_gscale, table, cu,
                                             p.valid_lens, 5, backend="numpy")


def ragged_table_out_of_order():
    """A grouped call's (B, L) table that is not C-contiguous: refused as score_topk's
    per-token table is (the GPU path would copy it into order from CuPy's pool)."""
    p = problem()
    ids = np.arange(6, dtype=np.int32).reshape(2, 3) % p.key_gscale.shape[0]  # every id in range
    wide = np.repeat(ids, 2, axis=1)
    cu = np.array([0, 2, 3], dtype=np.int32)
    return lambda: indexer.score_topk_ragged(p.q, p.w, p.keys_fp4, p.key_scale, p.key_gscale, wide[:, ::2], cu,
                                             p.valid_lens, 5, backend="numpy")


def pool_full():
    pool = KeyPool(1, entries_per_block=4, head_dim=32)
    return lambda: pool.append(0, np.ones((5, 32), np.float32))


def pool_wrong_dim():
    pool = KeyPool(2, entries_per_block=4, head_dim=32)
    return lambda: pool.append(0, np.ones((3, 64), np.float32))


def grouped_prepare_of_0d_query():
    p = problem()
    cu = np.array([0, 3], dtype=np.int32)
    return lambda: indexer.prepare(np.zeros((), np.float32), p.w, p.keys_fp4, p.key_scale, p.key_gscale,
                                   p.block_table[:1].copy(), p.valid_lens, 5, cu_seqlens_q=cu, backend="numpy")


def write_keys_into_read_only(which):
    """write_keys into a pool one of whose arrays is read-only: refused before any byte is
    written (the other arrays checked unchanged)."""
    pool = [np.zeros((4, 4, 16), np.uint8), np.zeros((4, 4, 2), np.uint8), np.ones(4, np.float32)]
    pool[which].setflags(write=False)

    def call():
        before = [a.copy() for a in pool]
        try:
            indexer.write_keys(np.ones((2, 32), np.float32), np.array([0, 1], np.int32), *pool)
        finally:
            for a, b in zip(before, pool):
                np.testing.assert_array_equal(a, b)
    return call


def pool_call(method, *args, **kwargs):
    pool = KeyPool(4, entries_per_block=4, head_dim=32)
    pool.append(0, np.ones((3, 32), np.float32))
    return lambda: getattr(pool, method)(*args, **kwargs)


API = [
    ("q float64", lambda: call_with(q=problem().q.astype(np.float64)), TypeError, "q"),
    ("q rank 2", lambda: call_with(q=problem().q[:, 0]), ValueError, "q"),
    ("q not contiguous", lambda: call_with(q=np.asfortranarray(problem().q)), ValueError, "q"),
    ("q strided", lambda: call_with(q=np.repeat(problem().q, 2, axis=1)[:, ::2]), ValueError, "q"),
    ("q a list", lambda: call_with(q=problem().q.tolist()), TypeError, "q"),
    ("empty batch", lambda: call_with(q=problem().q[:0], w=problem().w[:0], block_table=problem().block_table[:0],
                                      valid_lens=problem().valid_lens[:0]), ValueError, "q"),
    ("D not a multiple of 32", lambda: call_with(q=np.ones((3, 8, 48), np.float32)), ValueError, "q"),
    ("more than 128 heads", lambda: call_with(q=np.ones((3, 129, 64), np.float32),
                                              w=np.ones((3, 129), np.float32)), ValueError, "q"),
    ("w shape", lambda: call_with(w=problem().w[:, :4].copy()), ValueError, "w"),
    ("w int", lambda: call_with(w=problem().w.astype(np.int32)), TypeError, "w"),
    ("keys_fp4 int8", lambda: call_with(keys_fp4=problem().keys_fp4.view(np.int8)), TypeError, "keys_fp4"),
    ("keys_fp4 other head dim", lambda: call_with(keys_fp4=np.zeros((6, 16, 64), np.uint8)), ValueError, "keys_fp4"),
    ("key_scale shape", lambda: call_with(key_scale=problem().key_scale[:, :, :2].copy()), ValueError, "key_scale"),
    ("key_gscale length", lambda: call_with(key_gscale=problem().key_gscale[:-1].copy()), ValueError, "key_gscale"),
    ("key_gscale zero", lambda: with_gscale(0.0), ValueError, "key_gscale"),
    ("key_gscale negative", lambda: with_gscale(-1.0), ValueError, "key_gscale"),
    ("key_gscale NaN", lambda: with_gscale(np.nan), ValueError, "key_gscale"),
    ("key_gscale inf", lambda: with_gscale(np.inf), ValueError, "key_gscale"),
    ("block_table int64", lambda: call_with(block_table=problem().block_table.astype(np.int64)), TypeError, "block_table"),
    ("block_table rows", lambda: call_with(block_table=problem().block_table[:2].copy()), ValueError, "block_table"),
    ("visible block id past P", lambda: with_block(0, 0, 10_000), ValueError, "block_table"),
    ("visible block id -1", lambda: with_block(1, 2, -1), ValueError, "block_table"),
    ("valid_lens int64", lambda: call_with(valid_lens=problem().valid_lens.astype(np.int64)), TypeError, "valid_lens"),
    ("valid_lens negative", lambda: with_lens([20, -1, 0]), ValueError, "valid_lens"),
    ("valid_lens beyond L*E", lambda: with_lens([20, 49, 0]), ValueError, "valid_lens"),
    ("top_k zero", lambda: call_with(top_k=0), ValueError, "top_k"),
    ("top_k beyond the maximum", lambda: call_with(top_k=indexer.MAX_TOP_K + 1), ValueError, "top_k"),
    ("top_k float", lambda: call_with(top_k=5.0), TypeError, "top_k"),
    ("top_k bool", lambda: call_with(top_k=True), TypeError, "top_k"),
    ("backend unknown", lambda: call_with(backend="tpu"), ValueError, "backend"),
    ("precision unknown", lambda: call_with(precision="half"), ValueError, "precision"),
    ("ragged offsets decreasing", ragged_decreasing, ValueError, "cu_seqlens_q"),
    ("ragged table out of C order", ragged_table_out_of_order, ValueError, "block_table"),
    ("out int64", lambda: call_with(out=np.zeros((3, 5), np.int64)), TypeError, "out"),
    ("out of the wrong shape", lambda: call_with(out=np.zeros((3, 6), np.int32)), ValueError, "out"),
    ("out a pair without return_scores", lambda: call_with(out=(np.zeros((3, 5), np.int32),
                                                                np.zeros((3, 5), np.float32))), TypeError, "out"),
    ("out scores float64", lambda: call_with(return_scores=True, out=(np.zeros((3, 5), np.int32),
                                                                      np.zeros((3, 5), np.float64))), TypeError, "out"),
    ("workspace not a Workspace", lambda: call_with(workspace="ws"), TypeError, "workspace"),
    ("stream negative", lambda: call_with(stream=-1), ValueError, "stream"),
    ("quantize NaN", lambda: (lambda: nvfp4.quantize(np.array([np.nan] * 16, np.float32))), ValueError, "x"),
    ("quantize global scale 0", lambda: (lambda: nvfp4.quantize(np.ones(16, np.float32), 0.0)), ValueError,
     "global_scale"),
    ("pool append other head dim", pool_wrong_dim, ValueError, "keys"),
    ("pool full", pool_full, PoolFullError, "append"),
    ("prepare grouped with a 0-d q", grouped_prepare_of_0d_query, ValueError, "q"),
    ("causal_lens ratio past int64", lambda: (lambda: _lens_of_huge_ratio()), None, None),
    ("causal_lens context_lens ragged", lambda: (lambda: indexer.causal_lens(np.array([0, 1, 2]),
                                                                               context_lens=[1, [2]])),
     TypeError, "context_lens"),
    ("write_keys into read-only key_gscale", lambda: write_keys_into_read_only(2), ValueError, "key_gscale"),
    ("write_keys into read-only key_scale", lambda: write_keys_into_read_only(1), ValueError, "key_scale"),
    ("write_keys validate a str", lambda: (lambda: indexer.write_keys(
        np.ones((1, 32), np.float32), np.array([0], np.int32), np.zeros((4, 4, 16), np.uint8),
        np.zeros((4, 4, 2), np.uint8), np.ones(4, np.float32), validate="no")), TypeError, "validate"),
    ("KeyPool size past int32 by NumPy ints", lambda: (lambda: KeyPool(np.int32(65536), np.int32(32768), 32)),
     ValueError, "num_blocks"),
    ("KeyPool save to None", lambda: pool_call("save", None), TypeError, "path"),
    ("KeyPool append_many validate a str", lambda: pool_call("append_many", [0], np.ones((1, 32), np.float32),
                                                             validate="no"), TypeError, "validate"),
    ("KeyPool append_many 2-D counts", lambda: pool_call("append_many", [0, 1], np.ones((2, 32), np.float32),
                                                         counts=np.ones((2, 1), np.int64)), ValueError, "counts"),
    ("KeyPool score_topk ragged offsets", lambda: pool_call("score_topk", np.ones((3, 2, 32), np.float32),
                                                            np.ones((3, 2), np.float32), [0], 3,
                                                            cu_seqlens_q=[[0], [1, 2]]), TypeError, "cu_seqlens_q"),
    ("KeyPool from a saved id past int64", lambda: (lambda: KeyPool.from_arrays(_meta_with_a_huge_id())),
     ValueError, "arrays: pool_meta"),
    ("KeyPool from deeply nested JSON", lambda: (lambda: KeyPool.from_arrays(_nested_meta_arrays())),
     ValueError, "arrays: pool_meta"),
    ("key_sequences of a list", lambda: (lambda: io.key_sequences({"0": [[1.0] * 32]})), TypeError, "keys"),
    ("blocks_needed of 0 entries a block", lambda: (lambda: io.blocks_needed({"a": np.zeros((3, 32))}, 0)),
     ValueError, "entries_per_block"),
    ("e4m3_decode past a byte", lambda: (lambda: nvfp4.e4m3_decode(np.array([300]))), ValueError, "scale_bytes"),
    ("e4m3_decode negative", lambda: (lambda: nvfp4.e4m3_decode(np.array([-1]))), ValueError, "scale_bytes"),
    ("e4m3_decode floats", lambda: (lambda: nvfp4.e4m3_decode(np.array([1.5]))), TypeError, "scale_bytes"),
    ("e2m1_encode NaN", lambda: (lambda: nvfp4.e2m1_encode([np.nan])), ValueError, "x"),
    ("e4m3_encode negative", lambda: (lambda: nvfp4.e4m3_encode([-3.0])), ValueError, "x"),
    ("e4m3_encode NaN", lambda: (lambda: nvfp4.e4m3_encode([np.nan])), ValueError, "x"),
    ("pack_nibbles odd length", lambda: (lambda: nvfp4.pack_nibbles(np.zeros(3, np.uint8))), ValueError, "codes"),
    ("pack_nibbles past a nibble", lambda: (lambda: nvfp4.pack_nibbles(np.array([16, 0]))), ValueError, "codes"),
    ("unpack_nibbles 0-d", lambda: (lambda: nvfp4.unpack_nibbles(np.uint8(3))), ValueError, "packed"),
    ("global_scale_for NaN", lambda: (lambda: nvfp4.global_scale_for(np.nan)), ValueError, "amax"),
    ("global_scale_for negative", lambda: (lambda: nvfp4.global_scale_for(-1.0)), ValueError, "amax"),
    ("quantize global scale True", lambda: (lambda: nvfp4.quantize(np.ones(16, np.float32), True)), TypeError,
     "global_scale"),
    ("quantize global scale a dict", lambda: (lambda: nvfp4.quantize(np.ones(16, np.float32), {})), TypeError,
     "global_scale"),
    ("quantize ragged list", lambda: (lambda: nvfp4.quantize([[1.0] * 16, [1.0]])), TypeError, "x"),
    # the reference's public functions, called directly (indexer.reference)
    ("reference visible block id -1", lambda: reference_with(block_table=np.full((3, 3), -1, np.int32)),
     ValueError, "block_table_row"),
    ("reference valid_lens past the row", lambda: reference_with(valid_lens=np.array([20, 49, 0], np.int32)),
     ValueError, "n"),
    ("reference top_k bool", lambda: reference_with(top_k=True), TypeError, "top_k"),
    # the pool's and the query's shapes and types (before: an IndexError, an AxisError, NumPy's matmul error)
    ("reference key_gscale short", lambda: reference_with(key_gscale=problem().key_gscale[:1].copy()),
     ValueError, "key_gscale"),
    ("reference key_scale short", lambda: reference_with(key_scale=problem().key_scale[:1].copy()),
     ValueError, "key_scale"),
    ("reference keys_fp4 2-D", lambda: reference_with(keys_fp4=problem().keys_fp4[:, 0].copy()),
     ValueError, "keys_fp4"),
    ("reference keys_fp4 int8", lambda: reference_with(keys_fp4=problem().keys_fp4.view(np.int8)),
     TypeError, "keys_fp4"),
    ("reference w heads", lambda: reference_with(w=problem().w[:, :3].copy()), ValueError, "w"),
    ("reference q head dim", lambda: reference_with(q=np.ones((3, 8, 32), np.float32)), ValueError, "q"),
    ("reference key_gscale NaN", lambda: reference_with(key_gscale=np.full(problem().key_gscale.shape, np.nan,
                                                                           np.float32)), ValueError, "key_gscale"),
    ("reference row_scores w heads", lambda: (lambda: indexer.reference.row_scores(
        row_args()[0], row_args()[1][:3], *row_args()[2:])), ValueError, "w"),
    ("reference row_keys key_scale short", lambda: (lambda: indexer.reference.row_keys(
        row_args()[2], row_args()[3][:1], *row_args()[4:6], 10)), ValueError, "key_scale"),
    ("reference ragged offsets short", lambda: (lambda: indexer.reference.score_topk_ragged(
        *problem().arrays()[:5], problem().block_table[:1].copy(), np.array([0, 7], np.int32), problem().valid_lens, 5)),
     ValueError, "cu_seqlens_q"),
    ("reference row_scores chunk -1", lambda: (lambda: indexer.reference.row_scores(
        *row_args(), chunk=-1)), ValueError, "chunk"),
    ("reference row_keys past the row", lambda: (lambda: indexer.reference.row_keys(
        *row_args()[2:6], 49)), ValueError, "n"),
    ("reference select_top_k 2-D", lambda: (lambda: indexer.reference.select_top_k(np.zeros((2, 2)), 1)), TypeError,
     "scores"),
    ("reference select_top_k negative", lambda: (lambda: indexer.reference.select_top_k(np.zeros(3), -1)),
     ValueError, "top_k"),
    ("reference to_physical E 0", lambda: (lambda: indexer.reference.to_physical(
        np.zeros((1, 1), np.int32), np.zeros((1, 1), np.int32), 0)), ValueError, "E"),
    ("reference to_physical past int32", lambda: (lambda: indexer.reference.to_physical(
        np.zeros((1, 1), np.int32), np.full((1, 1), 2**30, np.int32), 4)), ValueError, "block_table"),
    # KeyPool.score_topk: a row may not see past its sequence's end (entries never written to it)
    ("KeyPool score_topk valid_lens past the sequence", lambda: pool_call(
        "score_topk", np.ones((1, 2, 32), np.float32), np.ones((1, 2), np.float32), [0], 3,
        cu_seqlens_q=np.array([0, 1], np.int32), valid_lens=np.array([4], np.int32)), ValueError, "valid_lens"),
    ("KeyPool score_topk valid_lens past the sequence, validate=False on the host", lambda: pool_call(
        "score_topk", np.ones((1, 2, 32), np.float32), np.ones((1, 2), np.float32), [0], 3,
        cu_seqlens_q=np.array([0, 1], np.int32), valid_lens=np.array([4], np.int32), validate=False,
        backend="numpy"), ValueError, "valid_lens"),
    ("KeyPool score_topk grouped 2-D q", lambda: pool_call(
        "score_topk", np.ones((2, 32), np.float32), np.ones((2, 2), np.float32), [0], 3,
        cu_seqlens_q=np.array([0, 2], np.int32)), ValueError, "q"),
    ("KeyPool score_topk ragged list q", lambda: pool_call("score_topk", [[1.0], [1.0, 2.0]], np.ones((2, 2), np.float32),
                                                           [0, 0], 3), TypeError, "q"),
    ("KeyPool append an id past int64", lambda: pool_call("append", 10**5000, np.ones((1, 32), np.float32)),
     ValueError, "seq"),
    ("KeyPool save a NUL path", lambda: pool_call("save", "x\x00.npz"), ValueError, "'x"),  # the path's repr first
    # indexer.testing, the notebooks' helpers
    ("random_problem without a Generator", lambda: (lambda: testing.random_problem(None)), TypeError, "rng"),
    ("random_problem E 0", lambda: (lambda: testing.random_problem(np.random.default_rng(0), E=0)), ValueError, "E"),
    ("random_problem negative lens", lambda: (lambda: testing.random_problem(np.random.default_rng(0), lens=-1)),
     ValueError, "lens"),
    ("quantize_blocks 4-D", lambda: (lambda: testing.quantize_blocks(np.ones((2, 2, 4, 32), np.float32))),
     ValueError, "keys"),
    ("check_topk of no problem", lambda: (lambda: testing.check_topk(None, np.zeros((1, 1), np.int32))), TypeError,
     "p"),
    # the benchmark's arguments, refused before any GPU is asked for
    ("bench cases None", lambda: (lambda: indexer.bench.select_cases(None)), TypeError, "--cases"),
    ("bench run an unknown case", lambda: (lambda: indexer.bench.run(["nope"], ["fast"])), ValueError, "cases"),
    ("bench run 0 repeats", lambda: (lambda: indexer.bench.run(["mtp-2"], ["fast"], 0)), ValueError, "repeats"),
]


def reference_with(**changes):
    """indexer.reference.score_topk called directly with some arguments replaced."""
    p = problem()
    args = dict(zip(testing.ARRAY_NAMES, p.arrays()), top_k=p.top_k)
    args.update(changes)
    return lambda: indexer.reference.score_topk(*[args[n] for n in testing.ARRAY_NAMES], args["top_k"])


def row_args():
    """(q[1], w[1], the pool, block_table[1], valid_lens[1]): row_scores' arguments for row 1."""
    p = problem()
    return p.q[1], p.w[1], p.keys_fp4, p.key_scale, p.key_gscale, p.block_table[1], int(p.valid_lens[1])


def _lens_of_huge_ratio():
    """Not an error: a ratio past every position sees nothing (int64 arithmetic, no overflow)."""
    lens = indexer.causal_lens(np.array([0, 3, 5]), ratio=2**100)
    np.testing.assert_array_equal(lens, np.zeros(5, np.int32))
    np.testing.assert_array_equal(indexer.causal_lens(np.array([0, 3, 5]), ratio=np.uint64(2**64 - 1)), lens)


def _meta_with_a_huge_id():
    pool = KeyPool(2, entries_per_block=4, head_dim=32)
    pool.append(5, np.ones((1, 32), np.float32))
    meta = pool._meta()
    meta["sequences"][0]["id"] = 2**64  # what no call could name (ids are int64's)
    text = json.dumps(meta).encode()
    return {"keys_fp4": pool.keys_fp4, "key_scale": pool.key_scale, "key_gscale": pool.key_gscale,
            "pool_meta": np.frombuffer(text, np.uint8)}


def _nested_meta_arrays():
    pool = KeyPool(2, entries_per_block=4, head_dim=32)
    return {"keys_fp4": pool.keys_fp4, "key_scale": pool.key_scale, "key_gscale": pool.key_gscale,
            "pool_meta": np.frombuffer(b"[" * 100_000 + b"]" * 100_000, np.uint8)}


@pytest.mark.parametrize("name,make,error,arg", API, ids=[a[0] for a in API])
def test_api_catalogue(name, make, error, arg):
    fn = make()
    if error is None:  # an input that is odd, not wrong: the call checks its own answer
        fn()
        return
    with pytest.raises(error, match=rf"(?i)^{arg}\b|{arg}:"):
        fn()


def test_failed_calls_leave_the_inputs_unchanged():
    """Every failed catalogue call leaves the arrays it was handed (SHARED's, where it
    replaced none) as they were, bit for bit."""
    pristine = [a.copy() for a in problem().arrays()]
    for _name, make, error, _arg in API:
        if error is None:
            continue
        before = copy.deepcopy(SHARED.arrays())
        with pytest.raises(error):
            make()()
        for a, b, c in zip(before, SHARED.arrays(), pristine):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
            np.testing.assert_array_equal(b.view(np.uint8), c.view(np.uint8))


def test_the_unchanged_inputs_check_can_fail(monkeypatch):
    """A call that wrote into SHARED's arrays is caught by the check above."""
    def scribble(*args, **kwargs):
        args[0][0, 0, 0] += 1.0  # q, SHARED's own
        raise ValueError("q: refused after writing into it")

    monkeypatch.setattr(indexer, "score_topk", scribble)
    before = copy.deepcopy(SHARED.arrays())
    try:
        with pytest.raises(ValueError):
            call_with()()
        assert not np.array_equal(before[0], SHARED.q)
    finally:
        SHARED.q[...] = before[0]


def saved_problem(tmp_path, **replace):
    p = problem()
    data = dict(zip(testing.ARRAY_NAMES, p.arrays()))
    data.update(replace)
    path = tmp_path / "problem.npz"
    io.write_arrays(path, data)
    return path


def cli_missing_file(tmp_path):
    return ["score", str(tmp_path / "nope.npz"), "--top-k", "4"]


def cli_truncated(tmp_path):
    path = saved_problem(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return ["score", str(path), "--top-k", "4"]


def cli_pickle(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, q=np.array([{"a": 1}], dtype=object))
    return ["score", str(path), "--top-k", "4"]


def cli_missing_array(tmp_path):
    p = problem()
    data = dict(zip(testing.ARRAY_NAMES, p.arrays()))
    del data["w"]
    path = tmp_path / "partial.npz"
    io.write_arrays(path, data)
    return ["score", str(path), "--top-k", "4"]


def cli_pool_other_head_dim(tmp_path):
    pool = KeyPool(4, entries_per_block=16, head_dim=64)
    pool.append(0, np.random.default_rng(1).standard_normal((20, 64)).astype(np.float32))
    pool_path = tmp_path / "pool.npz"
    pool.save(pool_path)
    data = io.read_arrays(pool_path)
    data.update(q=np.ones((1, 8, 128), np.float32), w=np.ones((1, 8), np.float32), seqs=np.array([0]))
    path = tmp_path / "pool_q.npz"
    io.write_arrays(path, data)
    return ["score", str(path), "--top-k", "4"]


def cli_bad_top_k(tmp_path):
    return ["score", str(saved_problem(tmp_path)), "--top-k", "0"]


def cli_wrong_dtype(tmp_path):
    return ["score", str(saved_problem(tmp_path, q=problem().q.astype(np.float64))), "--top-k", "4"]


def cli_unknown_output(tmp_path):
    return ["score", str(saved_problem(tmp_path)), "--top-k", "4", "--out", str(tmp_path / "x.csv")]


def cli_pack_nan(tmp_path):
    path = tmp_path / "keys.npz"
    k = np.ones((4, 32), np.float32)
    k[1, 1] = np.nan
    io.write_arrays(path, {"0": k})
    return ["pack", str(path), "--out", str(tmp_path / "pool.npz")]


def cli_pack_zip_of_text(tmp_path):
    path = tmp_path / "keys.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("0.txt", b"not an array")
    return ["pack", str(path), "--out", str(tmp_path / "pool.npz")]


def cli_demo_too_large(tmp_path):
    return ["demo", "--backend", "numpy", "--queries", str(10**12), "--entries", "1"]


def cli_score_out_onto_a_folder(tmp_path):
    (tmp_path / "out.npz").mkdir()
    return ["score", str(saved_problem(tmp_path)), "--top-k", "4", "--out", str(tmp_path / "out.npz")]


def cli_plot_out_onto_a_folder(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "p.png").mkdir()
    return ["plot", str(saved_problem(tmp_path)), "--top-k", "4", "--out", str(tmp_path / "p.png")]


def cli_plot_deep_json(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    return ["plot", str(path), "--out", str(tmp_path / "o.png")]


def cli_bench_json_onto_a_folder(tmp_path):
    return ["bench", "--json", str(tmp_path)]


def cli_bench_too_many_repeats(tmp_path):
    return ["bench", "--repeats", str(10**20)]


CLI = [cli_plot_deep_json, cli_bench_json_onto_a_folder, cli_bench_too_many_repeats, cli_missing_file, cli_truncated, cli_pickle, cli_missing_array, cli_pool_other_head_dim, cli_bad_top_k,
       cli_wrong_dtype, cli_unknown_output, cli_pack_nan, cli_pack_zip_of_text, cli_demo_too_large,
       cli_score_out_onto_a_folder, cli_plot_out_onto_a_folder]


@pytest.mark.parametrize("make_args", CLI, ids=[f.__name__ for f in CLI])
def test_cli_catalogue(tmp_path, make_args, monkeypatch):
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("unpickled user data"))
    result = separate_runner().invoke(cli.main, make_args(tmp_path))
    assert result.exit_code != 0
    err = result.stderr
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err


def test_catalogue_is_at_least_thirty_distinct_inputs():
    assert len(API) + len(CLI) >= 30
