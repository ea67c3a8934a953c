"""Grouped query files on the command line (``cu_seqlens_q``, as ``score_topk_ragged`` takes
it): both file forms, scored in runs of rows that cut through sequences, against the
per-token reference; their refusals; one GPU run against the reference."""

import numpy as np
import pytest
from cli_runner import separate_runner

import indexer
from indexer import KeyPool, cli, io, reference, runs, testing
from tests.gpu import requires_gpu
from tests.test_ragged import as_problem, grouped_problem


def run_cli(*args):
    return separate_runner().invoke(cli.main, [str(a) for a in args])


def one_error_line(result):
    assert result.exit_code not in (0, None), result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


def grouped_file(tmp_path, rng, counts, *, top_k=6, name="grouped.npz", **changes):
    """A grouped arrays-form file: (the ``score_topk_ragged`` arguments, its path)."""
    args = grouped_problem(rng, counts, H=4, D=32, E=8, top_k=top_k)
    names = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "cu_seqlens_q", "valid_lens")
    data = dict(zip(names, args))
    data.update(changes)
    path = tmp_path / name
    io.write_arrays(path, data)
    return args, path


@pytest.mark.parametrize("cu", [[0, 0, 2, 2, 5, 5], [0, 5], [0, 1, 2, 3], [0, 0, 0, 4]])
def test_sequences_of_rows_cover_each_row_with_its_sequence(cu):
    cu = np.array(cu, dtype=np.int32)
    T = int(cu[-1])
    truth = np.searchsorted(cu, np.arange(T), side="right") - 1  # each row's sequence
    for r0 in range(T):
        for r1 in range(r0 + 1, T + 1):
            b0, b1, offsets = runs.sequences_of_rows(cu, r0, r1)
            assert offsets.dtype == np.int32 and offsets[0] == 0 and offsets[-1] == r1 - r0
            assert offsets.shape == (b1 - b0 + 1,) and np.all(np.diff(offsets) >= 0)
            got = b0 + np.searchsorted(offsets, np.arange(r1 - r0), side="right") - 1
            np.testing.assert_array_equal(got, truth[r0:r1])


@pytest.mark.parametrize("chunk", [1, 2, 3, 100])
def test_grouped_arrays_form_equals_the_per_token_reference(tmp_path, chunk):
    rng = np.random.default_rng(90 + chunk)
    args, path = grouped_file(tmp_path, rng, [3, 0, 4, 1, 0])
    out = tmp_path / "out.npz"
    r = run_cli("score", path, "--top-k", 6, "--chunk", chunk, "--backend", "numpy", "--out", out, "--scores")
    assert r.exit_code == 0, r.output
    got = io.read_arrays(out)
    p = as_problem(*args, 6)
    want_idx, want_sc = reference.score_topk(*p.arrays(), 6, return_scores=True)
    np.testing.assert_array_equal(got["indices"], want_idx)
    np.testing.assert_array_equal(got["scores"], want_sc)
    testing.check_topk(p, got["indices"], got["scores"])
    # the library's grouped call gives the same
    np.testing.assert_array_equal(indexer.score_topk_ragged(*args, 6, backend="numpy"), want_idx)


def test_grouped_arrays_form_physical_and_json(tmp_path):
    rng = np.random.default_rng(95)
    args, path = grouped_file(tmp_path, rng, [2, 3], top_k=4)
    r = run_cli("score", path, "--top-k", 4, "--chunk", 3, "--backend", "numpy", "--physical", "--json")
    assert r.exit_code == 0, r.output
    import json

    got = np.array(json.loads(r.stdout)["indices"])
    want = indexer.score_topk_ragged(*args, 4, backend="numpy", physical=True)
    np.testing.assert_array_equal(got, want)


def test_grouped_pool_form_with_and_without_row_lengths(tmp_path):
    rng = np.random.default_rng(96)
    pool = KeyPool(num_blocks=20, entries_per_block=8, head_dim=32)
    pool.append(3, rng.standard_normal((50, 32)).astype(np.float32))
    pool.append(9, rng.standard_normal((33, 32)).astype(np.float32))
    pool_path = tmp_path / "pool.npz"
    pool.save(pool_path)
    data = io.read_arrays(pool_path)
    cu = np.array([0, 4, 4, 7], dtype=np.int32)  # a sequence read by no row
    seqs = [9, 3, 3]
    data.update(q=rng.standard_normal((7, 4, 32)).astype(np.float32), w=rng.standard_normal((7, 4)).astype(np.float32),
                seqs=np.array(seqs, dtype=np.int32), cu_seqlens_q=cu)
    out = tmp_path / "out.npz"
    for lens in (None, indexer.causal_lens(cu, ratio=2, context_lens=[20, 0, 0])):
        if lens is not None:
            data["valid_lens"] = lens
        inp = tmp_path / "queries.npz"
        io.write_arrays(inp, data)
        r = run_cli("score", inp, "--top-k", 10, "--chunk", 3, "--backend", "numpy", "--out", out, "--scores")
        assert r.exit_code == 0, r.output
        got = io.read_arrays(out)
        want = pool.score_topk(data["q"], data["w"], seqs, 10, cu_seqlens_q=cu, valid_lens=lens, backend="numpy",
                               return_scores=True)
        np.testing.assert_array_equal(got["indices"], want[0])
        np.testing.assert_array_equal(got["scores"], want[1])
    assert np.any(got["indices"] == -1)  # causal rows shorter than k: padded


def test_grouped_pool_form_refusals(tmp_path):
    rng = np.random.default_rng(97)
    pool = KeyPool(num_blocks=4, entries_per_block=8, head_dim=32)
    pool.append(0, rng.standard_normal((10, 32)).astype(np.float32))
    data = io.read_arrays(_saved(pool, tmp_path))
    data.update(q=rng.standard_normal((3, 4, 32)).astype(np.float32), w=rng.standard_normal((3, 4)).astype(np.float32),
                seqs=np.array([0, 0, 0], dtype=np.int32), valid_lens=np.array([1, 2, 3], dtype=np.int32))
    inp = tmp_path / "q.npz"
    io.write_arrays(inp, data)
    # row lengths beside one id a row would go unused: refused, not ignored
    line = one_error_line(run_cli("score", inp, "--top-k", 2))
    assert "valid_lens: not used in this form of input (the pool form takes it only with cu_seqlens_q" in line
    data.update(seqs=np.array([0], dtype=np.int32), cu_seqlens_q=np.array([0, 3], dtype=np.int32),
                valid_lens=np.array([1, 11, 3], dtype=np.int32))
    io.write_arrays(inp, data)
    line = one_error_line(run_cli("score", inp, "--top-k", 2))
    assert "valid_lens: row 1 sees 11 entries, but its sequence holds 10" in line
    data.update(cu_seqlens_q=np.array([0, 3, 3], dtype=np.int32))  # two offsets a sequence of seqs
    io.write_arrays(inp, data)
    assert "cu_seqlens_q: expected shape (2,), one offset more than seqs has sequence ids (1)" in one_error_line(run_cli("score", inp, "--top-k", 2))
    data.update(cu_seqlens_q=np.array([0, 3], dtype=np.int64))
    io.write_arrays(inp, data)
    assert "cu_seqlens_q: expected dtype int32" in one_error_line(run_cli("score", inp, "--top-k", 2))
    # lengths of the wrong dtype are named as such, whatever their values
    data.update(cu_seqlens_q=np.array([0, 3], dtype=np.int32), valid_lens=np.array([1, 11, 3], dtype=np.int64))
    io.write_arrays(inp, data)
    assert "valid_lens: expected dtype int32" in one_error_line(run_cli("score", inp, "--top-k", 2))
    # one id a sequence: the messages say so
    data.update(valid_lens=np.array([1, 2, 3], dtype=np.int32), seqs=np.array([[0]], dtype=np.int32))
    io.write_arrays(inp, data)
    assert "one sequence id per sequence (with cu_seqlens_q)" in one_error_line(run_cli("score", inp, "--top-k", 2))
    data.update(q=data["q"][:0], w=data["w"][:0], valid_lens=data["valid_lens"][:0], seqs=np.array([], np.int32),
                cu_seqlens_q=np.array([0], dtype=np.int32))
    io.write_arrays(inp, data)
    assert "seqs: expected at least one sequence id" in one_error_line(run_cli("score", inp, "--top-k", 2))


def _saved(pool, tmp_path):
    path = tmp_path / "pool.npz"
    pool.save(path)
    return path


@pytest.mark.parametrize("change,fragment", [
    (lambda a: dict(cu_seqlens_q=a[6].astype(np.int64)), "cu_seqlens_q: expected dtype int32"),
    (lambda a: dict(cu_seqlens_q=a[6][:-1]), "cu_seqlens_q: expected shape (4,)"),
    (lambda a: dict(cu_seqlens_q=np.array([0, 4, 2, 5], np.int32)), "cu_seqlens_q: expected offsets from 0 to T = 6"),
    (lambda a: dict(cu_seqlens_q=np.array([0, 4, 2, 6], np.int32)), "cu_seqlens_q: expected non-decreasing"),
    (lambda a: dict(block_table=a[5].astype(np.int64)), "block_table: expected dtype int32"),
    (lambda a: dict(block_table=np.repeat(a[5], np.diff(a[6]), axis=0)), "cu_seqlens_q: expected shape (7,)"),
])
def test_grouped_arrays_form_refusals_name_the_array(tmp_path, change, fragment):
    rng = np.random.default_rng(98)
    args = grouped_problem(rng, [4, 0, 2], H=4, D=32, E=8, top_k=3)
    _, path = grouped_file(tmp_path, np.random.default_rng(98), [4, 0, 2], top_k=3, **change(args))
    assert fragment in one_error_line(run_cli("score", path, "--top-k", 3, "--backend", "numpy"))


def test_an_out_of_range_length_is_named_by_its_row_across_runs(tmp_path):
    rng = np.random.default_rng(105)
    args = list(grouped_problem(rng, [3, 4], H=4, D=32, E=8, seq_entries=[16, 16], top_k=3))
    args[7][5] = -2
    names = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "cu_seqlens_q", "valid_lens")
    path = tmp_path / "bad.npz"
    io.write_arrays(path, dict(zip(names, args)))
    for chunk in (1, 2, 4, 7):
        line = one_error_line(run_cli("score", path, "--top-k", 3, "--chunk", chunk, "--backend", "numpy"))
        assert "valid_lens: expected 0 <= n <= L*E = 16" in line and "(the first out of range: -2 at row 5)" in line


def test_grouped_bad_block_id_is_named_by_sequence_and_row_across_runs(tmp_path):
    rng = np.random.default_rng(99)
    args = list(grouped_problem(rng, [2, 3, 2], H=4, D=32, E=8, seq_entries=[16, 16, 16], top_k=3))
    args[5][2, 1] = args[2].shape[0] + 7  # sequence 2's second block: its rows 5 and 6 see it
    args[7][:] = [1, 1, 1, 1, 1, 16, 3]  # row 5 sees both of its blocks, row 6 only the first
    names = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "cu_seqlens_q", "valid_lens")
    path = tmp_path / "bad.npz"
    io.write_arrays(path, dict(zip(names, args)))
    for chunk in (1, 2, 4, 7):
        line = one_error_line(run_cli("score", path, "--top-k", 3, "--chunk", chunk, "--backend", "numpy"))
        assert f"got {args[2].shape[0] + 7} at row 2 (for query row 5), logical block 1" in line, (chunk, line)


def test_plot_reads_a_grouped_file(tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(100)
    args, path = grouped_file(tmp_path, rng, [2, 3])
    for kind in ("selection", "scores"):
        r = run_cli("plot", path, "--kind", kind, "--top-k", 4, "--backend", "numpy", "--out", tmp_path / f"{kind}.png")
        assert r.exit_code == 0, r.output
        assert (tmp_path / f"{kind}.png").stat().st_size > 0


def test_load_problem_expands_a_grouped_input_per_token(tmp_path):
    rng = np.random.default_rng(101)
    args, path = grouped_file(tmp_path, rng, [0, 3, 1])
    data = io.read_arrays(path)
    problem, k, cu = io.load_grouped_problem(data, top_k=5)
    assert k == 5 and cu is data["cu_seqlens_q"]  # as stored: the table per sequence
    assert problem == tuple(data[n] for n in io.PROBLEM_NAMES)
    per_token, _ = io.load_problem(data, top_k=5)
    np.testing.assert_array_equal(per_token[5], as_problem(*args, 5).block_table)
    assert per_token[:5] == problem[:5] and per_token[6] is problem[6]


def test_a_grouped_file_is_checked_a_run_at_a_time(tmp_path, monkeypatch):
    """No per-token table of the whole file is built to check or score it: each is a run's."""
    rng = np.random.default_rng(103)
    args, path = grouped_file(tmp_path, rng, [5, 0, 6])
    built = []
    expand = indexer.ragged.expand_block_table
    monkeypatch.setattr(indexer.ragged, "expand_block_table",
                        lambda table, cu, T, **kw: built.append(T) or expand(table, cu, T, **kw))
    out = tmp_path / "out.npz"
    r = run_cli("score", path, "--top-k", 6, "--chunk", 4, "--backend", "numpy", "--out", out)
    assert r.exit_code == 0, r.output
    assert built and max(built) <= 4, built
    np.testing.assert_array_equal(io.read_arrays(out)["indices"], indexer.score_topk_ragged(*args, 6, backend="numpy"))


def test_arrays_a_form_would_leave_unused_are_refused(tmp_path):
    rng = np.random.default_rng(104)
    _, path = grouped_file(tmp_path, rng, [2, 1], seqs=np.array([0, 1], dtype=np.int32))
    assert "seqs: not used in this form of input" in one_error_line(run_cli("score", path, "--top-k", 2))
    pool = KeyPool(num_blocks=4, entries_per_block=8, head_dim=32)
    pool.append(0, rng.standard_normal((10, 32)).astype(np.float32))
    data = io.read_arrays(_saved(pool, tmp_path))
    data.update(q=rng.standard_normal((2, 4, 32)).astype(np.float32), w=rng.standard_normal((2, 4)).astype(np.float32),
                seqs=np.array([0, 0], dtype=np.int32), block_table=np.full((2, 2), 3, dtype=np.int32))
    inp = tmp_path / "q.npz"
    io.write_arrays(inp, data)
    assert "block_table: not used in this form of input" in one_error_line(run_cli("score", inp, "--top-k", 2))


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_a_file_scored_in_runs_on_the_gpu_matches_the_reference(tmp_path, precision, grouped):
    """Both layouts of a file, in three runs of rows (the pool copied to the GPU once)."""
    rng = np.random.default_rng(102)
    args = grouped_problem(rng, [40, 0, 1, 23], H=64, D=128, E=64, seq_entries=[900, 10, 300, 700], ratio=4,
                           top_k=32)
    p = as_problem(*args, 32)
    if grouped:
        names = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "cu_seqlens_q", "valid_lens")
        data = dict(zip(names, args))
    else:
        data = dict(zip(io.PROBLEM_NAMES, p.arrays()))
    path = tmp_path / "prefill.npz"
    io.write_arrays(path, data)
    out = tmp_path / "out.npz"
    r = run_cli("score", path, "--top-k", 32, "--chunk", 25, "--backend", "cuda", "--precision", precision,
                "--out", out, "--scores")
    assert r.exit_code == 0, r.output
    got = io.read_arrays(out)
    tol = testing.TOL_FAST if precision == "fast" else testing.TOL_EXACT
    testing.check_topk(p, got["indices"], got["scores"], tol=tol)
