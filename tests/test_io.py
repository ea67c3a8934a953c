"""indexer.io: arrays files for the CLI (.npz, .safetensors, .npy), never unpickling."""

import json
import os
import sys

import numpy as np
import pytest

from indexer import io, reference, testing
from indexer.pool import KeyPool


def _sample(rng):
    return {
        "q": rng.standard_normal((3, 4, 32)).astype(np.float32),
        "codes": rng.integers(0, 256, size=(5, 7), dtype=np.uint8),
        "table": rng.integers(-1, 100, size=(3, 2), dtype=np.int32),
        "big": rng.integers(-(2**40), 2**40, size=(4,), dtype=np.int64),
    }


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k])


def _one_line(exc_info):
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


# ----------------------------------------------------------------------------- round trips


def test_npz_round_trip(tmp_path, rng):
    arrays = _sample(rng) | {"top_k": np.array(7, dtype=np.int64)}
    path = tmp_path / "a.npz"
    io.write_arrays(path, arrays)
    back = io.read_arrays(path)
    _assert_same(arrays, back)
    assert back["top_k"].shape == ()
    # np.savez's format: np.load reads it as usual
    with np.load(path, allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(arrays)


def test_npz_names_that_collide_with_savez_parameters(tmp_path, rng):
    arrays = {"file": rng.standard_normal(3).astype(np.float32), "allow_pickle": np.arange(1, 4, dtype=np.int32)}
    io.write_arrays(tmp_path / "a.npz", arrays)
    _assert_same(arrays, io.read_arrays(tmp_path / "a.npz"))


def test_npy_round_trip(tmp_path, rng):
    a = rng.standard_normal((6, 32)).astype(np.float32)
    path = tmp_path / "keys.npy"
    io.write_arrays(str(path), {"anything": a})
    back = io.read_arrays(str(path))
    assert list(back) == ["keys"]  # named after the file's stem
    _assert_same({"keys": a}, back)


def test_npy_holds_exactly_one_array(tmp_path, rng):
    with pytest.raises(ValueError, match=r"a \.npy file holds exactly one array, got 2") as e:
        io.write_arrays(tmp_path / "two.npy", {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)})
    assert str(tmp_path / "two.npy") in _one_line(e)
    assert not (tmp_path / "two.npy").exists()


def test_safetensors_round_trip(tmp_path, rng):
    pytest.importorskip("safetensors")
    arrays = _sample(rng)
    path = tmp_path / "a.safetensors"
    io.write_arrays(path, arrays)
    _assert_same(arrays, io.read_arrays(path))


@pytest.mark.parametrize("kind", ("bfloat16", "float8_e4m3fn"))
def test_bfloat16_and_float8_go_to_safetensors_bit_for_bit_and_are_refused_by_npz_and_npy(tmp_path, rng, kind,
                                                                                          monkeypatch):
    """A bf16 model's query, or DeepSeek's FP8 one: .safetensors keeps its bits (from
    ml_dtypes' NumPy array, or from a PyTorch tensor where one is installed); .npz and .npy
    would save raw bytes that read back as no float type, so the write is refused by name."""
    pytest.importorskip("safetensors")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q = rng.standard_normal((2, 4, 32)).astype(getattr(ml_dtypes, kind))
    bits = q.view(np.int16 if q.itemsize == 2 else np.uint8)
    forms = [q]
    try:
        import torch  # noqa: PLC0415  (optional)
    except ImportError:
        torch = None
    if torch is not None:
        forms.append(torch.from_numpy(bits).view(getattr(torch, kind)))
    for i, a in enumerate(forms):
        path = tmp_path / f"q{i}.safetensors"
        io.write_arrays(path, {"q": a, "w": np.ones((2, 4), np.float32)})
        back = io.read_arrays(path)
        assert list(back) == ["q", "w"]  # the float8 one read beside the others (safe_open's order: by name)
        assert back["q"].dtype == q.dtype and back["q"].shape == q.shape and back["q"].tobytes() == q.tobytes()
    for fmt in (".npz", ".npy"):
        with pytest.raises(ValueError, match=f"array 'q' is {kind}, which \\{fmt} cannot hold"):
            io.write_arrays(tmp_path / f"q{fmt}", {"q": q})
        assert not (tmp_path / f"q{fmt}").exists()
    # read where ml_dtypes is missing: the array and the way out named, not the file blamed
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "ml_dtypes", None)  # an import of it fails
        with pytest.raises(ValueError, match=f"array 'q' is {kind}, which NumPy holds only through ml_dtypes"):
            io.read_arrays(tmp_path / "q0.safetensors")


@pytest.mark.parametrize("kind", ("bfloat16", "float8_e4m3fn"))
def test_a_bfloat16_or_float8_array_numpy_saved_itself_is_named_on_reading(tmp_path, rng, kind):
    """NumPy's own np.savez / np.save keep such an array as raw bytes (|V2, |V1), which read
    back as no number type: the reader says so, naming the array and the way out (before:
    the CLI's "q: expected dtype ... got |V2")."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q = rng.standard_normal((2, 4, 32)).astype(getattr(ml_dtypes, kind))
    np.savez(tmp_path / "p.npz", q=q, w=np.ones((2, 4), np.float32))
    np.save(tmp_path / "q.npy", q)
    for name in ("p.npz", "q.npy"):
        with pytest.raises(ValueError, match=f"array 'q' holds raw {q.itemsize}-byte values .* save it as float32, "
                                             "or in .safetensors"):
            io.read_arrays(tmp_path / name)


def test_a_float8_tensor_saved_by_hand_is_read_and_a_corrupt_one_is_named(tmp_path):
    """An F8_E4M3 tensor as any writer lays it out (header JSON, then its bytes), which
    safetensors' NumPy reader cannot name; the same file cut short is refused by path."""
    pytest.importorskip("safetensors")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q = np.array([[-448.0, -0.5, 0.0, 2.0**-9, 1.125, 448.0]], np.float32).astype(ml_dtypes.float8_e4m3fn)
    head = json.dumps({"__metadata__": {"format": "pt"},
                       "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "q": {"dtype": "F8_E4M3", "shape": [1, 6], "data_offsets": [8, 14]}}).encode()
    head += b" " * (-len(head) % 8)
    body = np.array([1.5, -2.0], np.float32).tobytes() + q.tobytes()
    path = tmp_path / "q8.safetensors"
    path.write_bytes(len(head).to_bytes(8, "little") + head + body)
    back = io.read_arrays(path)
    assert back["q"].dtype == q.dtype and back["q"].tobytes() == q.tobytes()
    np.testing.assert_array_equal(back["a"], [1.5, -2.0])
    path.write_bytes(len(head).to_bytes(8, "little") + head + body[:-1])
    with pytest.raises(ValueError, match="q8.safetensors: not a readable .safetensors file"):
        io.read_arrays(path)


def test_other_ml_dtypes_types_go_to_safetensors_only(tmp_path, rng):
    """float8_e5m2 (ml_dtypes' only, NumPy has none): .safetensors keeps it (safetensors'
    NumPy reader cannot read it: io reads its bytes), .npz and .npy, which would save it
    as bytes no reader takes for it again, refuse it by name."""
    pytest.importorskip("safetensors")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = rng.standard_normal((3, 5)).astype(ml_dtypes.float8_e5m2)
    io.write_arrays(tmp_path / "e5.safetensors", {"x": a})
    back = io.read_arrays(tmp_path / "e5.safetensors")["x"]
    assert back.dtype == a.dtype and back.shape == a.shape and back.tobytes() == a.tobytes()
    for fmt in (".npz", ".npy"):
        with pytest.raises(ValueError, match=f"array 'x' is float8_e5m2, which \\{fmt} cannot hold"):
            io.write_arrays(tmp_path / f"e5{fmt}", {"x": a})
        assert not (tmp_path / f"e5{fmt}").exists()


def test_a_dtype_numpy_has_no_type_for_is_named_with_its_array(tmp_path):
    """A safetensors dtype that neither NumPy nor this reader's ml_dtypes map holds (F4, two
    four-bit floats a byte) is refused naming the array, not with NumPy's AttributeError;
    the E8M0 scales of MX formats come back as ml_dtypes' type."""
    pytest.importorskip("safetensors")
    ml_dtypes = pytest.importorskip("ml_dtypes")

    def laid_out(path, dtype, nbytes, shape):
        head = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                           "x": {"dtype": dtype, "shape": shape, "data_offsets": [4, 4 + nbytes]}}).encode()
        head += b" " * (-len(head) % 8)
        path.write_bytes(len(head).to_bytes(8, "little") + head + np.float32(1.0).tobytes() + bytes(range(nbytes)))

    laid_out(tmp_path / "f4.safetensors", "F4", 2, [4])
    with pytest.raises(ValueError, match="f4.safetensors: array 'x' has dtype F4, which NumPy has no type"):
        io.read_arrays(tmp_path / "f4.safetensors")
    if hasattr(ml_dtypes, "float8_e8m0fnu"):
        laid_out(tmp_path / "e8.safetensors", "F8_E8M0", 4, [2, 2])
        back = io.read_arrays(tmp_path / "e8.safetensors")["x"]
        assert back.dtype == ml_dtypes.float8_e8m0fnu and back.shape == (2, 2)
        assert back.tobytes() == bytes(range(4))


def test_plain_lists_are_written_as_arrays(tmp_path):
    for fmt in (".npz", ".npy"):
        io.write_arrays(tmp_path / f"a{fmt}", {"top_k": [7]})
        np.testing.assert_array_equal(next(iter(io.read_arrays(tmp_path / f"a{fmt}").values())), [7])


def test_safetensors_keeps_a_0d_array_and_c_order(tmp_path):
    pytest.importorskip("safetensors")
    table = np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    io.write_arrays(tmp_path / "k.safetensors", {"top_k": np.array(5, dtype=np.int32), "table": table})
    back = io.read_arrays(tmp_path / "k.safetensors")
    assert back["top_k"].shape == () and int(back["top_k"]) == 5
    np.testing.assert_array_equal(back["table"], table)


@pytest.mark.parametrize("fmt", [".npz", ".safetensors"])
def test_writing_onto_a_folder_or_with_a_nul_name_is_refused_by_path(tmp_path, fmt):
    if fmt == ".safetensors":
        pytest.importorskip("safetensors")
    (tmp_path / f"d{fmt}").mkdir()
    with pytest.raises(IsADirectoryError, match=f"^{tmp_path / f'd{fmt}'}: is a folder, not a file"):
        io.write_arrays(tmp_path / f"d{fmt}", {"a": np.ones(2)})
    with pytest.raises(ValueError, match="array names must be non-empty strings without NUL"):
        io.write_arrays(tmp_path / f"n{fmt}", {"a\x00b": np.ones(2)})
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"d{fmt}"]


def test_safetensors_pool_meta_travels_as_metadata(tmp_path, rng):
    safetensors = pytest.importorskip("safetensors")
    pool = KeyPool(4, entries_per_block=8, head_dim=32)
    pool.append(3, rng.standard_normal((11, 32)).astype(np.float32))
    pool.save(tmp_path / "pool.safetensors")
    arrays = io.read_arrays(tmp_path / "pool.safetensors")
    assert sorted(arrays) == ["key_gscale", "key_scale", "keys_fp4", "pool_meta"]
    assert arrays["pool_meta"].dtype == np.uint8 and arrays["pool_meta"].ndim == 1
    # written back, pool_meta is header metadata again, so KeyPool.load reads the copy
    io.write_arrays(tmp_path / "copy.safetensors", arrays)
    with safetensors.safe_open(str(tmp_path / "copy.safetensors"), framework="numpy") as f:
        assert "pool_meta" not in f.keys()
        assert f.metadata()["pool_meta"] == arrays["pool_meta"].tobytes().decode()
    copy = KeyPool.load(tmp_path / "copy.safetensors")
    np.testing.assert_array_equal(copy.keys(3), pool.keys(3))


def test_safetensors_non_text_pool_meta_stays_a_tensor(tmp_path):
    pytest.importorskip("safetensors")
    arrays = {"pool_meta": np.array([0xFF, 0xFE, 0x41], dtype=np.uint8)}
    io.write_arrays(tmp_path / "m.safetensors", arrays)
    _assert_same(arrays, io.read_arrays(tmp_path / "m.safetensors"))


def test_safetensors_refuses_strings(tmp_path):
    pytest.importorskip("safetensors")
    with pytest.raises(ValueError, match="cannot write as .safetensors") as e:
        io.write_arrays(tmp_path / "s.safetensors", {"seqs": np.array(["a", "b"])})
    _one_line(e)
    assert not list(tmp_path.iterdir())  # no half-written or temporary file left behind


def test_safetensors_not_installed(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors -> ImportError
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    for call in (lambda: io.read_arrays(tmp_path / "x.safetensors"),
                 lambda: io.write_arrays(tmp_path / "x.safetensors", {"a": np.ones(2, np.float32)})):
        (tmp_path / "x.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
        with pytest.raises(ValueError, match=r"pip install safetensors") as e:
            call()
        assert "x.safetensors" in _one_line(e)


def test_written_file_has_the_usual_mode(tmp_path):
    path = tmp_path / "m.npz"
    io.write_arrays(path, {"a": np.arange(3, dtype=np.int32)})
    mask = os.umask(0o022)
    os.umask(mask)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~mask)


def test_write_overwrites_in_place(tmp_path):
    path = tmp_path / "a.npz"
    io.write_arrays(path, {"a": np.arange(3, dtype=np.int32)})
    io.write_arrays(path, {"b": np.arange(4, dtype=np.int32)})
    assert list(io.read_arrays(path)) == ["b"]
    assert [p.name for p in tmp_path.iterdir()] == ["a.npz"]


@pytest.mark.parametrize("writer", ["write_arrays", "KeyPool.save"])
def test_a_file_replaced_keeps_its_mode_and_links_and_long_names_work(tmp_path, monkeypatch, writer):
    def write(path, n):
        if writer == "write_arrays":
            io.write_arrays(path, {"a": np.arange(n, dtype=np.int32)})
        else:
            KeyPool(n, entries_per_block=4, head_dim=32).save(path)

    def written(path):
        arrays = io.read_arrays(path)
        return arrays["a"].size if writer == "write_arrays" else arrays["key_gscale"].size

    path = tmp_path / "m.npz"
    write(path, 3)
    os.chmod(path, 0o640)
    write(path, 4)
    assert (path.stat().st_mode & 0o777) == 0o640 and written(path) == 4
    link = tmp_path / "link.npz"  # a symbolic link: its target is replaced, the link kept
    link.symlink_to(path)
    write(link, 5)
    assert link.is_symlink() and written(path) == 5
    long = tmp_path / ("x" * 240 + ".npz")  # near NAME_MAX: the temporary name stays short
    write(long, 2)
    assert written(long) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, link.name, long.name])
    absent = tmp_path / "no" / "p.npz"  # the error names the path asked for, not a temporary file
    with pytest.raises((ValueError, FileNotFoundError), match=f"^{absent}: folder .* does not exist$"):
        write(absent, 1)
    os.chmod(path, 0o440)  # read-only: refused as writing into it would be, left as it was
    before = path.read_bytes()
    if os.access(path, os.W_OK):  # root writes to any file: read-only as another user sees it
        monkeypatch.setattr(os, "access", lambda p, mode: mode != os.W_OK)
    with pytest.raises(PermissionError, match=f"^{path}: the file is not writable$"):
        write(path, 7)
    assert path.read_bytes() == before


# ----------------------------------------------------------------------------- bad files


def test_pickle_bearing_npz_is_refused(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, ok=np.arange(3), bad=np.array([1, "x", None], dtype=object))
    with pytest.raises(ValueError, match="refusing to unpickle") as e:
        io.read_arrays(path)
    assert str(path) in _one_line(e)


def test_pickle_bearing_npy_is_refused(tmp_path):
    path = tmp_path / "evil.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="refusing to unpickle"):
        io.read_arrays(path)


@pytest.mark.parametrize("fmt", [".npz", ".npy", ".safetensors"])
def test_truncated_file(tmp_path, rng, fmt):
    if fmt == ".safetensors":
        pytest.importorskip("safetensors")
    path = tmp_path / f"t{fmt}"
    arrays = {"t": rng.standard_normal((64, 64)).astype(np.float32)}
    io.write_arrays(path, arrays)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"not a readable \{fmt} file") as e:
        io.read_arrays(path)
    assert str(path) in _one_line(e)


@pytest.mark.parametrize("fmt", [".npz", ".npy", ".safetensors"])
def test_empty_and_garbage_files(tmp_path, fmt):
    if fmt == ".safetensors":
        pytest.importorskip("safetensors")
    path = tmp_path / f"g{fmt}"
    for content in (b"", b"this is not an arrays file at all\n" * 3):
        path.write_bytes(content)
        with pytest.raises(ValueError, match="not a readable") as e:
            io.read_arrays(path)
        assert str(path) in _one_line(e)


def test_wrong_container_for_the_extension(tmp_path):
    np.save(tmp_path / "single.npy", np.arange(3))
    os.replace(tmp_path / "single.npy", tmp_path / "single.npz")
    with pytest.raises(ValueError, match="single .npy array, not an .npz archive"):
        io.read_arrays(tmp_path / "single.npz")
    np.savez(tmp_path / "many.npz", a=np.arange(3))
    os.replace(tmp_path / "many.npz", tmp_path / "many.npy")
    with pytest.raises(ValueError, match="an .npz archive, not a single .npy array"):
        io.read_arrays(tmp_path / "many.npy")


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(ValueError, match="no such file") as e:
        io.read_arrays(tmp_path / "absent.npz")
    assert "absent.npz" in _one_line(e)
    (tmp_path / "dir.npz").mkdir()
    with pytest.raises(ValueError, match="not a file"):
        io.read_arrays(tmp_path / "dir.npz")


@pytest.mark.parametrize("name", ["data.txt", "data.pt", "data", "data.npz.bak"])
def test_unknown_extension(tmp_path, name):
    (tmp_path / name).write_bytes(b"x")
    with pytest.raises(ValueError, match="unknown file type") as e:
        io.read_arrays(tmp_path / name)
    assert name in _one_line(e)
    with pytest.raises(ValueError, match="unknown file type"):
        io.write_arrays(tmp_path / name, {"a": np.ones(1, np.float32)})


def test_extension_is_case_insensitive(tmp_path):
    io.write_arrays(tmp_path / "UP.NPZ", {"a": np.arange(2, dtype=np.int32)})
    assert io.file_format(tmp_path / "UP.NPZ") == ".npz"
    np.testing.assert_array_equal(io.read_arrays(tmp_path / "UP.NPZ")["a"], [0, 1])


def test_write_refusals(tmp_path):
    with pytest.raises(ValueError, match="refusing to pickle"):
        io.write_arrays(tmp_path / "o.npz", {"o": np.array([None, 1], dtype=object)})
    with pytest.raises(ValueError, match="nothing to write"):
        io.write_arrays(tmp_path / "e.npz", {})
    with pytest.raises(ValueError, match="non-empty strings"):
        io.write_arrays(tmp_path / "n.npz", {3: np.ones(1)})
    with pytest.raises(ValueError, match="does not exist"):
        io.write_arrays(tmp_path / "no" / "such" / "dir.npz", {"a": np.ones(1)})
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- load_problem


def _problem_arrays(rng, top_k=None):
    p = testing.random_problem(rng, T=3, H=4, D=32, E=8, top_k=5)
    arrays = dict(zip(io.PROBLEM_NAMES, p.arrays()))
    if top_k is not None:
        arrays["top_k"] = np.array(top_k)
    return p, arrays


def test_load_problem_arrays_form_passes_arrays_through(rng):
    p, arrays = _problem_arrays(rng, top_k=9)
    arrays["extra"] = np.ones(3)  # ignored
    problem, k = io.load_problem(arrays)
    assert k == 9
    assert all(a is b for a, b in zip(problem, p.arrays()))  # nothing copied or converted


def test_load_problem_never_converts(rng):
    _, arrays = _problem_arrays(rng)
    arrays["q"] = arrays["q"].astype(np.float64)
    problem, _ = io.load_problem(arrays, top_k=3)
    assert problem[0].dtype == np.float64  # left for indexer.validate to report


@pytest.mark.parametrize("missing", io.PROBLEM_NAMES)
def test_load_problem_missing_array(rng, missing):
    _, arrays = _problem_arrays(rng, top_k=4)
    del arrays[missing]
    with pytest.raises(ValueError, match=rf"^in\.npz: missing array '{missing}'") as e:
        io.load_problem(arrays, name="in.npz")
    _one_line(e)


def test_load_problem_top_k_sources(rng):
    _, arrays = _problem_arrays(rng, top_k=9)
    assert io.load_problem(arrays, top_k=2)[1] == 2  # the argument wins
    arrays["top_k"] = np.array([11], dtype=np.int32)  # a one-element array works too
    assert io.load_problem(arrays)[1] == 11
    del arrays["top_k"]
    with pytest.raises(ValueError, match=r"^f: no top_k given"):
        io.load_problem(arrays, name="f")
    arrays["top_k"] = np.array(4.0)
    with pytest.raises(TypeError, match="'top_k' must be an integer array, got dtype float64"):
        io.load_problem(arrays)
    arrays["top_k"] = np.array([4, 5])
    with pytest.raises(ValueError, match=r"'top_k' must hold one integer, got shape \(2,\)"):
        io.load_problem(arrays)


def _pool_arrays(tmp_path, rng, fmt=".npz"):
    pool = KeyPool(12, entries_per_block=8, head_dim=32)
    pool.append(5, rng.standard_normal((20, 32)).astype(np.float32))
    pool.append("doc", rng.standard_normal((3, 32)).astype(np.float32))
    pool.append(-2, rng.standard_normal((8, 32)).astype(np.float32))
    pool.save(tmp_path / f"pool{fmt}")
    arrays = io.read_arrays(tmp_path / f"pool{fmt}")
    arrays["q"] = rng.standard_normal((4, 2, 32)).astype(np.float32)
    arrays["w"] = rng.standard_normal((4, 2)).astype(np.float32)
    arrays["seqs"] = np.array([5, -2, 5, 5], dtype=np.int64)
    return pool, arrays


@pytest.mark.parametrize("fmt", [".npz", ".safetensors"])
def test_load_problem_pool_form(tmp_path, rng, fmt):
    if fmt == ".safetensors":
        pytest.importorskip("safetensors")
    pool, arrays = _pool_arrays(tmp_path, rng, fmt)
    assert io.is_pool_form(arrays)
    io.write_arrays(tmp_path / f"in{fmt}", arrays | {"top_k": np.array(6, dtype=np.int32)})
    problem, k = io.load_problem(io.read_arrays(tmp_path / f"in{fmt}"))
    assert k == 6
    q, w, codes, scales, gs, table, lens = problem
    seqs = [5, -2, 5, 5]
    np.testing.assert_array_equal(q, arrays["q"])
    np.testing.assert_array_equal(w, arrays["w"])
    np.testing.assert_array_equal(codes, pool.keys_fp4)
    np.testing.assert_array_equal(scales, pool.key_scale)
    np.testing.assert_array_equal(gs, pool.key_gscale)
    np.testing.assert_array_equal(table, pool.block_table(seqs))
    np.testing.assert_array_equal(lens, [20, 8, 20, 20])
    assert table.dtype == np.int32 and lens.dtype == np.int32
    # and the problem scores like the pool itself
    got = reference.score_topk(*problem, k)
    np.testing.assert_array_equal(got, pool.score_topk(q, w, seqs, k, backend="numpy"))


def test_load_problem_pool_form_string_ids(tmp_path, rng):
    pool, arrays = _pool_arrays(tmp_path, rng)
    arrays["seqs"] = np.array(["doc", "doc", "doc", "doc"])
    io.write_arrays(tmp_path / "in.npz", arrays)  # a '<U' array: no pickle needed
    (q, w, *_, table, lens), _ = io.load_problem(io.read_arrays(tmp_path / "in.npz"), top_k=2)
    np.testing.assert_array_equal(lens, [3, 3, 3, 3])
    np.testing.assert_array_equal(table, pool.block_table(["doc"] * 4))


def test_load_problem_pool_form_errors(tmp_path, rng):
    _, arrays = _pool_arrays(tmp_path, rng)
    for missing in io.POOL_QUERY_NAMES:
        bad = dict(arrays)
        del bad[missing]
        with pytest.raises(ValueError, match=rf"^p: missing array '{missing}' \(a saved KeyPool needs"):
            io.load_problem(bad, top_k=3, name="p")
    with pytest.raises(ValueError, match=r"^p: seqs: sequence 7 is not in the pool"):
        io.load_problem(arrays | {"seqs": np.array([5, 7, 5, 5])}, top_k=3, name="p")
    # a string of digits names the int id where the pool holds no such string (pack's ids)
    as_str, _ = io.load_problem(arrays | {"seqs": np.array(["5", "5", "5", "5"])}, top_k=3)
    as_int, _ = io.load_problem(arrays | {"seqs": np.array([5, 5, 5, 5])}, top_k=3)
    for a, b in zip(as_str, as_int):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"sequence 'x5' is not in the pool"):
        io.load_problem(arrays | {"seqs": np.array(["5", "x5", "5", "5"])}, top_k=3)
    with pytest.raises(TypeError, match="'seqs' must hold integer .* got dtype float64"):
        io.load_problem(arrays | {"seqs": np.array([5.0, 5.0, 5.0, 5.0])}, top_k=3)
    with pytest.raises(ValueError, match=r"'seqs' must be 1-D"):
        io.load_problem(arrays | {"seqs": np.array([[5, 5], [5, 5]])}, top_k=3)
    with pytest.raises(ValueError, match="no top_k given"):
        io.load_problem(arrays)
    meta = arrays["pool_meta"].copy()
    meta[:8] = np.frombuffer(b"garbage!", dtype=np.uint8)
    with pytest.raises(ValueError, match=r"^p: not a valid saved KeyPool \(pool_meta is not UTF-8 JSON") as e:
        io.load_problem(arrays | {"pool_meta": meta}, top_k=3, name="p")
    assert "indexer-" not in str(e.value)  # no temporary file names


# ----------------------------------------------------------------------------- key_sequences


def test_key_sequences_ids_and_order(rng):
    arrays = {
        "12": rng.standard_normal((3, 32)).astype(np.float32),
        "doc-a": rng.standard_normal((0, 32)).astype(np.float32),
        "-4": rng.standard_normal((70, 32)).astype(np.float32),
        "1.5": rng.standard_normal((1, 32)).astype(np.float32),
    }
    seqs = io.key_sequences(arrays)
    assert list(seqs) == [12, "doc-a", -4, "1.5"]
    assert all(seqs[k] is arrays[n] for k, n in zip(seqs, arrays))
    assert io.blocks_needed(seqs, 64) == 1 + 0 + 2 + 1
    assert io.blocks_needed(seqs, 1) == 74


def test_key_sequences_errors(rng):
    good = rng.standard_normal((3, 32)).astype(np.float32)
    with pytest.raises(ValueError, match="^k: holds no arrays"):
        io.key_sequences({}, name="k")
    with pytest.raises(TypeError, match="^k: array 'a' must be float32, got float64"):
        io.key_sequences({"a": good.astype(np.float64)}, name="k")
    with pytest.raises(ValueError, match=r"array 'a' must be 2-D \(n, D\), got shape \(32,\)"):
        io.key_sequences({"a": good[0]})
    with pytest.raises(ValueError, match="array 'b' has D = 64, the first array has D = 32"):
        io.key_sequences({"a": good, "b": np.ones((2, 64), np.float32)})
    with pytest.raises(ValueError, match="same sequence id 7"):
        io.key_sequences({"7": good, "007": good})


def test_an_empty_top_k_array_is_named():
    p = testing.random_problem(np.random.default_rng(0), T=1, H=8, D=32, E=4, top_k=2)
    arrays = dict(zip(io.PROBLEM_NAMES, p.arrays()), top_k=np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="input: array 'top_k' must hold one integer"):
        io.load_problem(arrays)


def test_a_digit_string_the_pool_holds_as_a_string_names_that_string():
    """A pool may hold the str id "7" and the int id 7: the string names the string."""
    rng = np.random.default_rng(1)
    pool = KeyPool(4, 4, 32)
    pool.append("7", rng.standard_normal((5, 32)).astype(np.float32))
    pool.append(7, rng.standard_normal((2, 32)).astype(np.float32))
    arrays = {n: np.asarray(getattr(pool, n)) for n in ("keys_fp4", "key_scale", "key_gscale")}
    arrays["pool_meta"] = np.frombuffer(json.dumps(pool._meta()).encode(), np.uint8)
    arrays.update(q=np.ones((2, 8, 32), np.float32), w=np.ones((2, 8), np.float32), seqs=np.array(["7", "7"]))
    problem, _ = io.load_problem(arrays, top_k=1)
    assert problem[-1].tolist() == [5, 5]


def test_a_pool_meta_that_is_not_text_stays_an_array_in_safetensors(tmp_path):
    pytest.importorskip("safetensors")
    io.write_arrays(tmp_path / "x.safetensors", {"pool_meta": np.arange(3, dtype=np.int32)})
    got = io.read_arrays(tmp_path / "x.safetensors")["pool_meta"]
    assert got.dtype == np.int32 and got.tolist() == [0, 1, 2]
