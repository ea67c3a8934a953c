"""The ``indexer`` command line (CPU only): click's CliRunner on small files in tmp_path."""

import json
import sys
import types

import numpy as np
import pytest
from cli_runner import separate_runner

import indexer
from indexer import arrays, cli, io, reference, testing
from indexer.pool import KeyPool

COMMANDS = ("demo", "score", "pack", "info", "bench", "plot")


@pytest.fixture
def run(monkeypatch):
    """Invoke the CLI; stdout and stderr come back separately."""
    monkeypatch.delenv("INDEXER_DEBUG", raising=False)
    runner = separate_runner()

    def invoke(*args, **kwargs):
        return runner.invoke(cli.main, [str(a) for a in args], **kwargs)

    return invoke


@pytest.fixture
def no_gpu(monkeypatch):
    """Make 'auto' pick NumPy even where a GPU exists: these tests are CPU-only."""
    monkeypatch.setattr(arrays, "gpu_available", lambda: False)
    monkeypatch.setattr(arrays, "gpu_supported", lambda device_id=None: False)


def assert_error(result, *fragments):
    """A user error: non-zero exit, one 'error:' line on stderr, no traceback."""
    assert result.exit_code not in (0, None), result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.output
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def problem_file(tmp_path, rng, *, top_k=None, T=3, name="problem.npz", **changes):
    p = testing.random_problem(rng, T=T, H=4, D=32, E=8, top_k=top_k or 6)
    data = dict(zip(io.PROBLEM_NAMES, p.arrays()))
    if top_k is not None:
        data["top_k"] = np.array(top_k, dtype=np.int32)
    data.update(changes)
    path = tmp_path / name
    io.write_arrays(path, data)
    return p, path


def parse_table(text):
    lines = text.strip().splitlines()
    header = lines[0].split()
    return header, [line.split() for line in lines[1:]]


# ----------------------------------------------------------------------------- help, version


def test_group_help_and_version(run):
    r = run("--help")
    assert r.exit_code == 0
    for c in COMMANDS:
        assert c in r.stdout
    assert "Examples:" in r.stdout
    r = run("--version")
    assert r.exit_code == 0 and indexer.__version__ in r.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(run, command):
    r = run(command, "--help")
    assert r.exit_code == 0
    assert f"indexer {command}" in r.stdout  # the example line
    assert "Example" in r.stdout
    r2 = run(command, "-h")
    assert r2.stdout == r.stdout


# ----------------------------------------------------------------------------- demo


def test_demo_numpy_matches_the_reference(run):
    r = run("demo", "--backend", "numpy", "--entries", "300", "--top-k", "32", "--queries", "3", "--show", "2")
    assert r.exit_code == 0, r.output
    assert "backend   numpy" in r.stdout
    assert "matches the reference" in r.stdout
    assert "NOT" not in r.stdout
    header, rows = parse_table(r.stdout.split("\n\n", 1)[1])
    assert header == ["query", "rank", "index", "score"]
    assert [row[:2] for row in rows] == [[str(t), str(k)] for t in range(3) for k in range(2)]
    for row in rows:
        assert 0 <= int(row[2]) < 300
    scores = [float(row[3]) for row in rows]
    assert scores[0] >= scores[1] and scores[2] >= scores[3]


def test_demo_default_sizes_auto_backend(run, no_gpu):
    r = run("demo", "--show", "0")
    assert r.exit_code == 0, r.output
    assert "backend   numpy" in r.stdout
    assert "4 queries x 64 heads x D 128; 4 sequences x 4096 entries in 256 blocks of 64; top_k 512" in r.stdout
    assert "matches the reference" in r.stdout
    assert "query  rank" not in r.stdout


def test_demo_json(run):
    r = run("demo", "--backend", "numpy", "--entries", "100", "--top-k", "128", "--queries", "2", "--json", "--seed", "3")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["ok"] is True and obj["check"] == "matches the reference" and obj["backend"] == "numpy"
    assert obj["sizes"]["entries_per_sequence"] == 100 and obj["sizes"]["pool_blocks"] == 4
    assert obj["time_ms"] > 0 and obj["first_call_ms"] is None
    assert len(obj["top"]) == 2 and all(len(row) == 5 for row in obj["top"])
    # same seed, same answer
    again = json.loads(run("demo", "--backend", "numpy", "--entries", "100", "--top-k", "128", "--queries", "2",
                           "--json", "--seed", "3").stdout)
    assert again["top"] == obj["top"]


def test_demo_json_padding_scores_are_null(run):
    r = run("demo", "--backend", "numpy", "--entries", "3", "--top-k", "5", "--queries", "1", "--json")
    obj = json.loads(r.stdout)
    assert [e["index"] for e in obj["top"][0]][3:] == [-1, -1]
    assert [e["score"] for e in obj["top"][0]][3:] == [None, None]


def test_demo_failed_check_exits_1(run, monkeypatch):
    def broken(*args, **kwargs):
        raise AssertionError("row 0: an unselected entry beats a selected one")

    monkeypatch.setattr(testing, "check_topk", broken)
    r = run("demo", "--backend", "numpy", "--entries", "64", "--top-k", "8", "--queries", "1")
    assert r.exit_code == 1
    assert "does NOT match the reference: row 0" in r.stdout
    r = run("demo", "--backend", "numpy", "--entries", "64", "--top-k", "8", "--queries", "1", "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["ok"] is False


def test_demo_cuda_without_gpu(run, no_gpu):
    assert_error(run("demo", "--backend", "cuda"), "CuPy")


def test_demo_bad_top_k(run):
    assert_error(run("demo", "--backend", "numpy", "--entries", "64", "--top-k", "0"), "top_k")
    assert_error(run("demo", "--entries", "0"), "--entries")
    assert_error(run("demo", "--seed", "-1"), "--seed")  # NumPy's own message would not name it


# ----------------------------------------------------------------------------- score: arrays form


def test_score_table(run, rng, tmp_path, no_gpu):
    p, path = problem_file(tmp_path, rng, top_k=6)
    r = run("score", path)
    assert r.exit_code == 0, r.output
    header, rows = parse_table(r.stdout)
    assert header == ["query", "rank", "index", "score"]
    idx, sc = reference.score_topk(*p.args(), return_scores=True)
    assert len(rows) == idx.size
    np.testing.assert_array_equal(np.array([int(x[2]) for x in rows]).reshape(idx.shape), idx)
    got = np.array([float(x[3]) for x in rows]).reshape(sc.shape)
    np.testing.assert_allclose(got, sc, rtol=1e-5)
    r = run("score", path, "--no-scores")
    assert parse_table(r.stdout)[0] == ["query", "rank", "index"]


def test_score_json_with_top_k_override(run, rng, tmp_path):
    p, path = problem_file(tmp_path, rng, top_k=6, T=4)
    r = run("score", path, "--top-k", "40", "--json", "--backend", "numpy")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    p.top_k = 40
    idx, sc = reference.score_topk(*p.args(), return_scores=True)
    assert obj["top_k"] == 40 and obj["physical"] is False
    np.testing.assert_array_equal(np.array(obj["indices"]), idx)
    got = np.array([[-np.inf if x is None else x for x in row] for row in obj["scores"]])
    np.testing.assert_array_equal(got.astype(np.float32), sc)
    testing.check_topk(p, np.array(obj["indices"], dtype=np.int32), got.astype(np.float32))
    r = run("score", path, "--json", "--no-scores", "--backend", "numpy")
    assert "scores" not in json.loads(r.stdout)


@pytest.mark.parametrize("fmt", [".npz", ".safetensors", ".npy"])
def test_score_out_physical_scores(run, rng, tmp_path, fmt):
    if fmt == ".safetensors":
        pytest.importorskip("safetensors")
    p, path = problem_file(tmp_path, rng, top_k=7)
    out = tmp_path / f"topk{fmt}"
    extra = ["--scores"] if fmt != ".npy" else []
    r = run("score", path, "--out", out, "--physical", "--backend", "numpy", *extra)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("wrote indices int32(3, 7)") and str(out) in r.stdout
    got = io.read_arrays(out)
    idx, sc = reference.score_topk(*p.args(), return_scores=True, physical=True)
    if fmt == ".npy":
        assert list(got) == ["topk"]
        np.testing.assert_array_equal(got["topk"], idx)
    else:
        assert sorted(got) == ["indices", "scores"]
        np.testing.assert_array_equal(got["indices"], idx)
        np.testing.assert_array_equal(got["scores"], sc)
        testing.check_topk(p, got["indices"], got["scores"], physical=True)


def test_score_out_defaults_to_indices_only_and_json_summary(run, rng, tmp_path):
    p, path = problem_file(tmp_path, rng, top_k=5)
    out = tmp_path / "o.npz"
    r = run("score", path, "--out", out, "--json", "--backend", "numpy")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["out"] == str(out) and obj["arrays"] == {"indices": [3, 5]}
    np.testing.assert_array_equal(io.read_arrays(out)["indices"], reference.score_topk(*p.args()))


# ----------------------------------------------------------------------------- pack + score


def _write_keys(tmp_path, rng, fmt=".npz"):
    keys = {
        "0": rng.standard_normal((100, 64)).astype(np.float32),
        "7": rng.standard_normal((300, 64)).astype(np.float32) * np.float32(3),
        "doc": rng.standard_normal((5, 64)).astype(np.float32),
    }
    path = tmp_path / f"keys{fmt}"
    io.write_arrays(path, keys)
    return keys, path


@pytest.mark.parametrize("fmt", [".npz", ".safetensors"])
def test_pack_then_score(run, rng, tmp_path, fmt, no_gpu):
    if fmt == ".safetensors":
        pytest.importorskip("safetensors")
    keys, keys_path = _write_keys(tmp_path, rng, fmt)
    pool_path = tmp_path / f"pool{fmt}"
    r = run("pack", keys_path, "--out", pool_path, "--entries-per-block", "16")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == (f"packed 3 sequences (405 keys, D 64) into 27 blocks of 16 entries "
                                f"(27 used) -> {pool_path}")
    pool = KeyPool.load(pool_path)
    assert pool.sequences == [0, 7, "doc"] and pool.free_blocks == 0
    for sid, name in ((0, "0"), (7, "7"), ("doc", "doc")):
        assert pool.length(sid) == keys[name].shape[0]

    # the pool form of 'score': the pool's arrays plus q, w, seqs
    data = io.read_arrays(pool_path)
    T, H = 4, 8
    data["q"] = rng.standard_normal((T, H, 64)).astype(np.float32)
    data["w"] = rng.standard_normal((T, H)).astype(np.float32)
    data["seqs"] = np.array([7, 0, 7, 0], dtype=np.int32)
    inp = tmp_path / f"queries{fmt}"
    io.write_arrays(inp, data)
    out = tmp_path / "topk.npz"
    r = run("score", inp, "--top-k", "50", "--out", out, "--scores")
    assert r.exit_code == 0, r.output
    got = io.read_arrays(out)
    seqs = [7, 0, 7, 0]
    args = (data["q"], data["w"], pool.keys_fp4, pool.key_scale, pool.key_gscale,
            pool.block_table(seqs), pool.lengths(seqs), 50)
    idx, sc = reference.score_topk(*args, return_scores=True)
    np.testing.assert_array_equal(got["indices"], idx)
    np.testing.assert_array_equal(got["scores"], sc)
    assert np.all(idx[[1, 3], 50 - 1] >= 0)  # 100 keys: full rows
    # physical: slots of the pool
    r = run("score", inp, "--top-k", "50", "--physical", "--json")
    phys = np.array(json.loads(r.stdout)["indices"])
    np.testing.assert_array_equal(phys, reference.to_physical(idx, pool.block_table(seqs), 16))
    if fmt != ".npz":
        return  # (safetensors holds no string arrays)
    # one string array names ids of both kinds: "7" is the int id pack made of the name "7"
    data["seqs"] = np.array(["7", "doc", "7", "0"])
    io.write_arrays(inp, data)
    r = run("score", inp, "--top-k", "50", "--json")
    assert r.exit_code == 0, r.output
    mixed = [7, "doc", 7, 0]
    want = reference.score_topk(data["q"], data["w"], pool.keys_fp4, pool.key_scale, pool.key_gscale,
                                pool.block_table(mixed), pool.lengths(mixed), 50)
    np.testing.assert_array_equal(np.array(json.loads(r.stdout)["indices"]), want)


def test_pack_default_block_size_and_explicit_num_blocks(run, rng, tmp_path):
    keys, keys_path = _write_keys(tmp_path, rng)
    r = run("pack", keys_path, "--out", tmp_path / "p.npz", "--num-blocks", "20")
    assert r.exit_code == 0, r.output
    assert "into 20 blocks of 64 entries (8 used)" in r.stdout
    pool = KeyPool.load(tmp_path / "p.npz")
    assert pool.free_blocks == 12
    np.testing.assert_array_equal(pool.keys("doc"), KeyPool.load(tmp_path / "p.npz").keys("doc"))


def test_pack_empty_sequence_is_reported(run, rng, tmp_path):
    path = tmp_path / "k.npz"
    io.write_arrays(path, {"1": rng.standard_normal((3, 32)).astype(np.float32), "2": np.zeros((0, 32), np.float32)})
    r = run("pack", path, "--out", tmp_path / "p.npz")
    assert r.exit_code == 0, r.output
    assert "packed 1 sequences (3 keys, D 32) into 1 blocks" in r.stdout
    assert "1 empty sequence(s)" in r.stdout


def test_pack_errors(run, rng, tmp_path):
    keys, keys_path = _write_keys(tmp_path, rng)
    assert_error(run("pack", keys_path, "--out", tmp_path / "p.npz", "--num-blocks", "3"),
                 "need", "free blocks")  # PoolFullError
    assert_error(run("pack", keys_path, "--out", tmp_path / "p.npy"), "not .npy")
    assert_error(run("pack", keys_path, "--out", tmp_path / "p.txt"), "unknown file type")
    assert_error(run("pack", tmp_path / "absent.npz", "--out", tmp_path / "p.npz"), "absent.npz", "no such file")
    assert_error(run("pack", keys_path), "--out")
    bad = tmp_path / "k64.npz"
    io.write_arrays(bad, {"a": np.ones((3, 64), np.float64)})
    assert_error(run("pack", bad, "--out", tmp_path / "p.npz"), "'a' must be float32")
    odd = tmp_path / "k48.npz"
    io.write_arrays(odd, {"a": np.ones((3, 48), np.float32)})
    # named as the command's user knows them: the file's key width, not KeyPool's head_dim
    assert_error(run("pack", odd, "--out", tmp_path / "p.npz"),
                 "k48.npz: its keys' dimension: expected a positive multiple of 32 up to 256, got 48")
    # blocks too large for int32 slots: --num-blocks named only where it was given
    two = tmp_path / "two.npz"
    io.write_arrays(two, {"a": np.ones((1, 64), np.float32), "b": np.ones((1, 64), np.float32)})
    huge_e = ("--entries-per-block", str(2**30))
    assert_error(run("pack", two, "--out", tmp_path / "p.npz", *huge_e),
                 "--entries-per-block (KEYS need 2 blocks of 1073741824 entries): 2 blocks")
    assert_error(run("pack", two, "--out", tmp_path / "p.npz", *huge_e, "--num-blocks", "2"), "--num-blocks: 2 blocks")
    assert_error(run("pack", keys_path, "--out", tmp_path / "no" / "dir" / "p.npz"), "p.npz: folder")
    assert not (tmp_path / "p.npz").exists()


# ----------------------------------------------------------------------------- score errors


def test_score_refuses_an_output_it_cannot_write_before_scoring(run, rng, tmp_path, monkeypatch):
    _, path = problem_file(tmp_path, rng, top_k=4)

    def no_scoring(*args, **kwargs):
        raise AssertionError("scored before the output was checked")

    monkeypatch.setattr(indexer.runs, "score_runs", no_scoring)
    assert_error(run("score", path, "--out", tmp_path / "o.npy", "--scores"), "a .npy file holds one array")
    assert_error(run("score", path, "--out", tmp_path / "o.txt"), "unknown file type")
    assert not (tmp_path / "o.npy").exists()


def test_score_errors(run, rng, tmp_path, no_gpu):
    p, path = problem_file(tmp_path, rng, top_k=4)
    assert_error(run("score", tmp_path / "absent.npz"), "absent.npz: no such file")
    assert_error(run("score", tmp_path / "absent.txt"), "unknown file type")
    _, no_q = problem_file(tmp_path, rng, top_k=4, name="no_q.npz")
    data = io.read_arrays(no_q)
    del data["valid_lens"]
    io.write_arrays(no_q, data)
    assert_error(run("score", no_q), "no_q.npz: missing array 'valid_lens'")
    _, f64 = problem_file(tmp_path, rng, top_k=4, name="f64.npz", q=p.q.astype(np.float64))
    assert_error(run("score", f64), "q: expected dtype float32, float16, bfloat16 or float8_e4m3fn, got float64")
    _, shape = problem_file(tmp_path, rng, top_k=4, name="shape.npz", w=p.w[:, :2].copy())
    assert_error(run("score", shape), "w: expected shape")
    assert_error(run("score", path, "--top-k", "0"), "top_k: expected 1 <= top_k")
    assert_error(run("score", path, "--top-k", "100000"), "top_k")
    assert_error(run("score", path, "--top-k", "many"), "--top-k", "score --help")
    _, no_k = problem_file(tmp_path, rng, name="no_k.npz")
    assert_error(run("score", no_k), "no top_k given")
    _, float_k = problem_file(tmp_path, rng, name="float_k.npz", top_k=None)
    data = io.read_arrays(float_k) | {"top_k": np.array(3.0)}
    io.write_arrays(float_k, data)
    assert_error(run("score", float_k), "'top_k' must be an integer array")
    assert_error(run("score", path, "--out", tmp_path / "o.npy", "--scores"), "o.npy: a .npy file holds one array",
                 "--scores asks for two")
    assert_error(run("score", path, "--out", tmp_path / "o.csv"), "unknown file type")
    assert not (tmp_path / "o.npy").exists()
    assert_error(run("score", path, "--backend", "cuda"), "CuPy")
    assert_error(run("score", path, "--backend", "tpu"), "--backend")
    assert_error(run("score"), "Missing argument 'INPUT'")
    evil = tmp_path / "evil.npz"
    np.savez(evil, q=np.array([1, None], dtype=object))
    assert_error(run("score", evil), "refusing to unpickle")
    # arrays of no rows: refused by name, chunked or not (slicing a 0-d array fails)
    for name, value in (("q", np.float32(1)), ("valid_lens", np.int32(3)), ("block_table", np.int32(0))):
        _, zero_d = problem_file(tmp_path, rng, top_k=4, name=f"{name}_0d.npz", **{name: np.asarray(value)})
        for chunk in ("1", "1024"):
            assert_error(run("score", zero_d, "--chunk", chunk), f"{name}: expected")
    # an archive member whose header claims a terabyte: one line, not a MemoryError traceback
    import zipfile  # noqa: PLC0415

    huge = tmp_path / "huge.npz"
    huge.write_bytes(path.read_bytes())
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"
    header += " " * (118 - len(header)) + "\n"
    with zipfile.ZipFile(huge, "a") as z:
        z.writestr("big.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    result = run("score", huge)
    assert_error(result, "huge.npz: ")
    # the allocation fails where memory is not overcommitted; where it is (a GPU host with
    # vm.overcommit_memory=1), NumPy allocates and the read finds the member truncated
    assert ("needs more memory than is free" in result.stderr
            or "not a readable .npz file (EOF" in result.stderr), result.stderr


def test_score_pool_form_unknown_sequence(run, rng, tmp_path):
    keys, keys_path = _write_keys(tmp_path, rng)
    run("pack", keys_path, "--out", tmp_path / "p.npz")
    data = io.read_arrays(tmp_path / "p.npz")
    data |= {"q": np.ones((1, 2, 64), np.float32) * np.float32(0.5), "w": np.ones((1, 2), np.float32),
             "seqs": np.array([3])}
    io.write_arrays(tmp_path / "in.npz", data)
    assert_error(run("score", tmp_path / "in.npz", "--top-k", "4"), "sequence 3 is not in the pool")


def test_group_level_usage_errors(run):
    assert_error(run("--bogus"), "No such option")
    assert_error(run("frobnicate"), "No such command 'frobnicate'")


def test_debug_env_shows_the_exception(run, rng, tmp_path, monkeypatch):
    monkeypatch.setenv("INDEXER_DEBUG", "1")
    r = run("score", tmp_path / "absent.npz")
    assert r.exit_code != 0
    assert isinstance(r.exception, ValueError) and "no such file" in str(r.exception)


def test_main_entry_point_is_the_group():
    assert cli.main.name == "indexer"
    assert sorted(cli.main.commands) == sorted(COMMANDS)


# ----------------------------------------------------------------------------- info


def test_info_text_and_json(run, no_gpu, monkeypatch):
    monkeypatch.setattr(arrays, "cupy", lambda: None)
    r = run("info")
    assert r.exit_code == 0, r.output
    for name in ("indexer", "python", "numpy", "ml_dtypes", "click", "cupy", "gpu", "kernels", "kernel cache"):
        assert any(line.split("  ")[0].strip() == name for line in r.stdout.splitlines()), name
    assert "no GPU" in r.stdout
    r = run("info", "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["versions"]["indexer"] == indexer.__version__
    assert obj["versions"]["numpy"] == np.__version__
    assert set(obj["versions"]) >= {"python", "ml_dtypes", "click", "cupy"}
    assert obj["gpu"] == {"count": 0, "devices": [], "state": "no GPU"}
    assert obj["kernel_dir"] is None or obj["kernel_dir"].endswith("kernels")


def test_info_survives_broken_helpers(run, monkeypatch):
    import indexer._jit as jit

    def boom():
        raise FileNotFoundError("kernels/common.cuh not found")

    def broken_cupy():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(jit, "kernel_dir", boom)
    monkeypatch.setattr(jit, "cache_dir", boom)
    monkeypatch.setattr(arrays, "cupy", broken_cupy)
    r = run("info")
    assert r.exit_code == 0, r.output
    assert "unavailable (kernels/common.cuh not found)" in r.stdout
    assert "no GPU (driver exploded)" in r.stdout
    obj = json.loads(run("info", "--json").stdout)
    assert obj["kernel_dir"] is None and obj["errors"]["kernel_dir"] == "kernels/common.cuh not found"


def test_info_lists_gpus(run, monkeypatch):
    props = {0: {"name": b"NVIDIA H200", "major": 9, "minor": 0}, 1: {"name": "Other", "major": 8, "minor": 6},
             2: {"name": "Tesla T4", "major": 7, "minor": 5}}
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 3, getDeviceProperties=lambda i: props[i])
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))
    monkeypatch.setattr(arrays, "cupy", lambda: fake)
    r = run("info")
    lines = {line.split("  ")[0]: line.split("  ", 1)[1].strip() for line in r.stdout.splitlines()}
    assert lines["gpu 0"] == "NVIDIA H200 (compute capability 9.0)"
    assert lines["gpu 1"] == "Other (compute capability 8.6)"
    # a GPU older than the kernels run on says so, and what 'auto' does there
    assert lines["gpu 2"] == "Tesla T4 (compute capability 7.5: the CUDA kernels need 8.0; backend 'auto' takes NumPy)"
    assert "gpu" not in lines
    obj = json.loads(run("info", "--json").stdout)
    assert obj["gpu"]["count"] == 3 and obj["gpu"]["devices"][0]["compute_capability"] == "9.0"
    assert [d["supported"] for d in obj["gpu"]["devices"]] == [True, True, False]


def test_info_cupy_versions(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert cli._cupy_version() == "not installed"

    class Broken(types.ModuleType):
        def __getattr__(self, name):
            raise RuntimeError("CUDA driver version is insufficient")

    monkeypatch.setitem(sys.modules, "cupy", Broken("cupy"))
    assert cli._cupy_version() == "unusable (CUDA driver version is insufficient)"
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__="14.2.0"))
    assert cli._cupy_version() == "14.2.0"


def test_version_of_fallbacks(monkeypatch):
    assert cli._version_of("numpy") == np.__version__
    monkeypatch.setitem(sys.modules, "no_such_dist_xyz", types.SimpleNamespace(__version__="1.2.3"))
    assert cli._version_of("no_such_dist_xyz") == "1.2.3"
    assert cli._version_of("definitely-not-installed-xyz", "definitely_not_installed_xyz") == "not installed"


# ----------------------------------------------------------------------------- bench


def test_bench_help(run):
    r = run("bench", "--help")
    assert r.exit_code == 0
    assert "indexer bench --cases" in r.stdout and "Example" in r.stdout
    for opt in ("--cases", "--paths", "--repeats", "--json"):
        assert opt in r.stdout
    assert run("bench", "-h").stdout == r.stdout
    assert "bench" in run("--help").stdout


@pytest.mark.skipif(arrays.gpu_available(), reason="a GPU is present: bench would run")
def test_bench_without_gpu(run):
    assert_error(run("bench"), "GPU")


def test_bench_no_gpu_error_is_one_line(run, monkeypatch):
    monkeypatch.setattr(arrays, "cupy", lambda: None)
    line = assert_error(run("bench", "--cases", "decode-128K", "--paths", "fast"))
    assert line == "error: bench: needs CuPy and a CUDA GPU"
    r = run("bench", "--cases", "decode-128K")
    assert r.exit_code == 2 and r.stdout == ""  # the check comes before the progress bar


def test_bench_unknown_case_or_path(run):
    line = assert_error(run("bench", "--cases", "decode-128K,nope"), "unknown case 'nope'")
    for name in ("decode-1M", "decode-128K", "mtp-2", "prefill-chunk"):
        assert name in line
    assert_error(run("bench", "--paths", "fast,slow"), "unknown path 'slow'", "torch-composed")
    assert_error(run("bench", "--repeats", "0"), "--repeats")


def test_bench_runs_with_a_progress_bar(run, monkeypatch, tmp_path):
    from indexer import bench

    seen = {}

    def fake_run(cases, paths, repeats, json_path=None, progress=None, echo=None):
        seen.update(cases=[c.name for c in cases], paths=paths, repeats=repeats, json_path=json_path)
        echo(bench.HEADER)
        for c in cases:
            for p in paths:
                progress(c.name, p)
            echo(f"{c.name:15s} {'floor':20s} {1.0:9.3f}")
        return {}

    monkeypatch.setattr(bench, "require_gpu", lambda: None)
    monkeypatch.setattr(bench, "run", fake_run)
    out = tmp_path / "b.json"
    r = run("bench", "--cases", "all", "--paths", "fast,torch-topk", "--repeats", "4", "--json", out)
    assert r.exit_code == 0, r.output
    assert seen == {"cases": [c.name for c in bench.CASES], "paths": ["fast", "torch-topk"], "repeats": 4,
                    "json_path": str(out)}
    lines = r.stdout.splitlines()
    assert lines[0] == bench.HEADER and len(lines) == 1 + len(bench.CASES)
    assert lines[1].split() == ["decode-1M", "floor", "1.000"]
    assert "benchmarking" in r.stderr  # the bar (a label only when stderr is no terminal)
    r = run("bench")
    assert r.exit_code == 0, r.output
    assert seen["cases"] == bench.DEFAULT_CASES.split(",") and seen["paths"] == bench.DEFAULT_PATHS.split(",")
    assert seen["repeats"] == 20 and seen["json_path"] is None


def test_score_in_chunks_equals_one_call(tmp_path):
    from indexer import reference

    rng = np.random.default_rng(77)
    p = testing.random_problem(rng, T=7, H=8, D=64, E=16, L=4, top_k=6)
    path = tmp_path / "many.npz"
    io.write_arrays(path, dict(zip(testing.ARRAY_NAMES, p.arrays())))
    out = tmp_path / "out.npz"
    result = separate_runner().invoke(cli.main, ["score", str(path), "--top-k", "6", "--chunk", "3", "--backend", "numpy",
                                           "--out", str(out), "--scores"])
    assert result.exit_code == 0, result.output
    got = io.read_arrays(out)
    want_idx, want_sc = reference.score_topk(*p.arrays(), 6, return_scores=True)
    np.testing.assert_array_equal(got["indices"], want_idx)
    np.testing.assert_array_equal(got["scores"], want_sc)


def test_pack_and_plot_speak_json(tmp_path):
    import json

    rng = np.random.default_rng(78)
    keys = tmp_path / "keys.npz"
    io.write_arrays(keys, {"0": rng.standard_normal((40, 32)).astype(np.float32)})
    result = separate_runner().invoke(cli.main, ["pack", str(keys), "--out", str(tmp_path / "pool.npz"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["sequences"] == 1 and summary["keys"] == 40 and summary["head_dim"] == 32
    pytest.importorskip("matplotlib")
    p = testing.random_problem(rng, T=2, H=4, D=32, E=16, L=2, top_k=4)
    prob = tmp_path / "p.npz"
    io.write_arrays(prob, dict(zip(testing.ARRAY_NAMES, p.arrays())))
    result = separate_runner().invoke(cli.main, ["plot", str(prob), "--out", str(tmp_path / "s.png"), "--top-k", "4",
                                           "--backend", "numpy", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"out": str(tmp_path / "s.png"), "kind": "selection"}


# ----------------------------------------------------------------------------- --device


def _device_args(command, tmp_path, rng):
    if command == "score":
        _, path = problem_file(tmp_path, rng, top_k=4)
        return ["score", path]
    return [command]


@pytest.mark.parametrize("command", ["demo", "score", "bench"])
def test_device_option_is_in_the_help(run, command):
    assert "--device N" in run(command, "--help").stdout


@pytest.mark.parametrize("command", ["demo", "score", "bench"])
def test_device_beyond_the_device_count(run, monkeypatch, tmp_path, rng, command):
    monkeypatch.setattr(cli, "_device_count", lambda: 1)
    r = run(*_device_args(command, tmp_path, rng), "--device", "1")
    line = assert_error(r, "--device 1", "CuPy sees 1 CUDA device(s), numbered 0 to 0")
    assert r.exit_code == 2 and r.stdout == ""  # refused before any work
    assert line.startswith("error: --device 1")


@pytest.mark.parametrize("command", ["demo", "score", "bench"])
def test_device_without_a_gpu(run, monkeypatch, tmp_path, rng, command):
    monkeypatch.setattr(arrays, "cupy", lambda: None)
    assert cli._device_count() == 0
    r = run(*_device_args(command, tmp_path, rng), "--device", "0")
    assert_error(r, "--device 0: no CUDA GPU is visible")
    assert r.exit_code == 2


@pytest.mark.parametrize("command", ["demo", "score"])
def test_device_with_the_numpy_backend(run, tmp_path, rng, command):
    r = run(*_device_args(command, tmp_path, rng), "--backend", "numpy", "--device", "0")
    assert_error(r, "--device 0: runs on a GPU, but --backend is numpy")
    assert r.exit_code == 2


def test_device_must_be_a_non_negative_int(run):
    assert_error(run("demo", "--device", "-1"), "--device")
    assert_error(run("demo", "--device", "gpu1"), "--device")


def test_pack_of_only_empty_sequences_gives_a_pool_of_one_free_block(run, tmp_path):
    io.write_arrays(tmp_path / "k.npz", {"a": np.zeros((0, 32), np.float32)})
    r = run("pack", tmp_path / "k.npz", "--out", tmp_path / "p.npz")
    assert r.exit_code == 0, r.output
    pool = KeyPool.load(tmp_path / "p.npz")
    assert pool.num_blocks == 1 and pool.free_blocks == 1


def test_demo_on_numpy_checks_at_the_exact_tolerance(run):
    r = run("demo", "--backend", "numpy", "--entries", "64", "--top-k", "8", "--queries", "1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tol"] == testing.TOL_EXACT


def test_an_output_that_is_the_input_file_is_refused_before_the_work(run, rng, tmp_path, no_gpu):
    """--out naming the input (directly or through a link): refused, the input kept (before,
    'score in.npz --out in.npz' replaced the problem with its indices)."""
    _, path = problem_file(tmp_path, rng, top_k=4)
    before = path.read_bytes()
    link = tmp_path / "link.npz"
    link.symlink_to(path)
    hard = tmp_path / "hard.npz"
    hard.hardlink_to(path)
    for out in (path, link, hard):
        line = assert_error(run("score", path, "--out", out))
        assert line == f"error: {out}: is the input file {path}, which the result would replace; write it to another file"
    _, keys_path = _write_keys(tmp_path, rng)
    keys_before = keys_path.read_bytes()
    assert_error(run("pack", keys_path, "--out", keys_path), "is the input file")
    # an input that does not exist is reported as missing, not as the output
    assert_error(run("pack", tmp_path / "missing.npz", "--out", tmp_path / "missing.npz"), "no such file")
    assert path.read_bytes() == before and keys_path.read_bytes() == keys_before


def test_a_bad_row_past_the_first_chunk_is_named_by_its_own_row_before_any_scoring(run, rng, tmp_path, no_gpu):
    """Values are checked over the whole input first: the message names the row as the file
    numbers it (a chunk's check named it from the chunk's start), and no bar is drawn."""
    p = testing.random_problem(rng, T=9, H=4, D=32, E=8, lens=8, L=2, top_k=3)
    data = dict(zip(io.PROBLEM_NAMES, p.arrays()))
    data["block_table"][7, 0] = 99_999
    path = tmp_path / "bad_row.npz"
    io.write_arrays(path, data)
    r = run("score", path, "--top-k", "3", "--chunk", "2")
    assert_error(r, "block_table", "got 99999 at row 7")
    assert "scoring" not in r.stderr


def test_a_pool_file_name_in_capitals_is_written(run, rng, tmp_path, no_gpu):
    _, keys_path = _write_keys(tmp_path, rng)
    r = run("pack", keys_path, "--out", tmp_path / "POOL.NPZ")
    assert r.exit_code == 0, r.output
    assert KeyPool.load(str(tmp_path / "POOL.NPZ")).sequences


def test_safetensors_output_without_the_package_is_refused_before_the_work(run, rng, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # an import of it fails
    _, keys_path = _write_keys(tmp_path, rng)
    assert_error(run("pack", keys_path, "--out", tmp_path / "p.safetensors"), "p.safetensors", "pip install safetensors")
    assert not (tmp_path / "p.safetensors").exists()


def test_arrays_saved_in_fortran_order_are_read_as_their_values(run, rng, tmp_path, no_gpu):
    """w saved as a transpose's view (np.save keeps Fortran order): scored as its values (it
    was refused as not C-contiguous, a layout the file's user cannot see)."""
    p, path = problem_file(tmp_path, rng, top_k=4)
    data = dict(zip(io.PROBLEM_NAMES, p.arrays()))
    data["w"] = np.ascontiguousarray(data["w"].T).T
    assert data["w"].flags.f_contiguous and not data["w"].flags.c_contiguous
    fortran = tmp_path / "fortran.npz"
    np.savez(fortran, **data, top_k=np.array(4, np.int32))
    want = run("score", path, "--json")
    got = run("score", fortran, "--json")
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout) == json.loads(want.stdout)


def test_no_arguments_print_the_help_and_a_missing_value_names_its_command(run):
    r = run()
    assert r.exit_code == 0 and r.stdout.startswith("Usage: indexer") and "error" not in r.stdout
    assert_error(run("score", "x.npz", "--top-k"), "requires an argument", "(see 'indexer score --help')")


def test_pack_names_the_array_a_bad_key_came_from(run, tmp_path):
    keys = np.ones((4, 32), np.float32)
    keys[2, 3] = np.nan
    path = tmp_path / "k_nan.npz"
    io.write_arrays(path, {"s7": keys, "007": keys})
    assert_error(run("pack", path, "--out", tmp_path / "p.npz"), "k_nan.npz: array 's7': keys: NaN or Inf")
    io.write_arrays(path, {"007": keys})  # the file's name, not the id 7 it stands for
    assert_error(run("pack", path, "--out", tmp_path / "p.npz"), "k_nan.npz: array '007': keys: NaN or Inf")


def test_python_dash_m_indexer_runs_the_command_line(monkeypatch, capsys):
    import runpy  # noqa: PLC0415

    monkeypatch.setattr(sys, "argv", ["python -m indexer", "--version"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("indexer", run_name="__main__")  # as `python -m indexer --version` runs it
    assert info.value.code in (0, None)
    assert capsys.readouterr().out.startswith("indexer, version")
