"""float16 and bfloat16 queries on the NumPy path: every value of either is a float32 value,
so a call on them must give exactly what it gives on those values widened to float32 (the
GPU's side: tests/test_cuda_query_dtypes.py); other dtypes are refused by name."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import indexer
from indexer import testing, validate

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}


def narrowed(q, dtype):
    with np.errstate(over="ignore"):  # extreme_scales' largest queries: infinite in float16, as cast
        q16 = q.astype(DTYPES[dtype])
    return q16, q16.astype(np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ("random",) + testing.ADVERSARIAL_KINDS)
def test_the_reference_scores_a_16_bit_query_as_its_float32_values(dtype, kind):
    rng = np.random.default_rng(len(kind) + len(dtype))
    if kind == "random":
        p = testing.random_problem(rng, T=3, H=8, D=64, E=16, lens=[300, 17, 0], top_k=24)
    else:
        p = testing.adversarial_problem(kind, rng)
    q16, q32 = narrowed(p.q, dtype)
    got = indexer.score_topk(q16, *p.arrays()[1:], p.top_k, backend="numpy", return_scores=True)
    want = indexer.score_topk(q32, *p.arrays()[1:], p.top_k, backend="numpy", return_scores=True)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].tobytes() == want[1].tobytes()
    testing.check_topk(testing.Problem(q32, *p.arrays()[1:], p.top_k), got[0], got[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_prepared_and_ragged_calls_take_a_16_bit_query(dtype):
    rng = np.random.default_rng(9)
    p = testing.random_problem(rng, T=4, H=8, D=32, E=8, lens=[40, 3, 25, 0], top_k=6)
    q16, q32 = narrowed(p.q, dtype)
    want = indexer.score_topk(q32, *p.arrays()[1:], p.top_k, backend="numpy")
    step = indexer.prepare(q16, *p.arrays()[1:], p.top_k, backend="numpy")
    np.testing.assert_array_equal(step(q16, *p.arrays()[1:]), want)
    with pytest.raises(TypeError, match=f"^q: expected dtype {dtype} as prepared, got float32"):
        step(q32, *p.arrays()[1:])
    cu = np.array([0, 4], dtype=np.int32)  # one sequence of the four rows, its table the first row's
    table = p.block_table[:1].copy()
    grouped = indexer.score_topk_ragged(q16, p.w, p.keys_fp4, p.key_scale, p.key_gscale, table, cu, p.valid_lens,
                                        p.top_k, backend="numpy")
    np.testing.assert_array_equal(grouped, indexer.score_topk_ragged(q32, p.w, p.keys_fp4, p.key_scale,
                                                                     p.key_gscale, table, cu, p.valid_lens,
                                                                     p.top_k, backend="numpy"))


def test_the_problem_names_its_query_dtype_and_bits_are_no_query():
    p = testing.random_problem(np.random.default_rng(2), T=2, H=4, D=32, E=8, lens=9, top_k=4)
    for dtype, want in ((np.float32, "float32"), (np.float16, "float16"), (ml_dtypes.bfloat16, "bfloat16"),
                        (ml_dtypes.float8_e4m3fn, "float8_e4m3fn")):
        prob = validate.check_score_topk(p.q.astype(dtype), *p.arrays()[1:], p.top_k)
        assert prob.q_dtype == want
    bits = p.q.astype(ml_dtypes.bfloat16).view(np.uint16)
    with pytest.raises(TypeError, match="^q: expected dtype float32, float16, bfloat16 or float8_e4m3fn, got uint16"):
        validate.check_score_topk(bits, *p.arrays()[1:], p.top_k)
    # only the CUDA path's CuPy view of a bfloat16 query's bits is taken as bits: host uint16 values are not
    with pytest.raises(TypeError, match="^q: expected the uint16 CuPy bits of a bfloat16 query, got uint16"):
        validate.check_score_topk(bits, *p.arrays()[1:], p.top_k, q_bits_of="bfloat16")
    with pytest.raises(TypeError, match="^q: expected the uint8 CuPy bits of a float8_e4m3fn query, got uint16"):
        validate.check_score_topk(bits, *p.arrays()[1:], p.top_k, q_bits_of="float8_e4m3fn")
    with pytest.raises(TypeError, match="^q: a float16 query is not read as bits"):
        validate.check_score_topk(bits, *p.arrays()[1:], p.top_k, q_bits_of="float16")


@pytest.mark.parametrize("dtype", ("bfloat16", "float8_e4m3fn"))
def test_the_cli_scores_a_bfloat16_or_float8_query_saved_by_safetensors(tmp_path, dtype):
    """A model's saved query, bfloat16 or float8_e4m3fn in .safetensors (read through
    ml_dtypes; safetensors' own NumPy reader has no float8), scored as its float32 values."""
    pytest.importorskip("safetensors")
    from click.testing import CliRunner

    from indexer import cli, io

    p = testing.random_problem(np.random.default_rng(4), T=3, H=4, D=32, E=8, lens=[30, 7, 0], top_k=5)
    q16, q32 = narrowed(p.q, dtype)
    outs = []
    for q in (q16, q32):
        path = tmp_path / f"problem-{q.dtype}.safetensors"
        io.write_arrays(path, dict(zip(io.PROBLEM_NAMES, (q, *p.arrays()[1:]))))
        assert io.read_arrays(path)["q"].dtype == q.dtype
        # and in a process that has not imported ml_dtypes itself (the CLI's)
        code = f"from indexer import io; print(io.read_arrays({str(path)!r})['q'].dtype)"
        fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        assert fresh.stdout.strip() == str(q.dtype), fresh.stderr
        out = tmp_path / f"topk-{q.dtype}.npz"
        result = CliRunner().invoke(cli.main, ["score", str(path), "--top-k", "5", "--backend", "numpy",
                                               "--scores", "--out", str(out)])
        assert result.exit_code == 0, result.output
        outs.append(io.read_arrays(out))
    np.testing.assert_array_equal(outs[0]["indices"], outs[1]["indices"])
    assert outs[0]["scores"].tobytes() == outs[1]["scores"].tobytes()
    testing.check_topk(testing.Problem(q32, *p.arrays()[1:], p.top_k), outs[0]["indices"], outs[0]["scores"])
