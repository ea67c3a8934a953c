"""KeyPool: paging, the global-scale policy, validation, files, and scoring through the pool."""

from __future__ import annotations

import json
import pathlib
import sys

import ml_dtypes
import numpy as np
import pytest

import indexer
from indexer import arrays, nvfp4, reference
from indexer.pool import KeyPool, PoolFullError
from indexer.testing import Problem, check_topk

CAP = 6.0 * 448.0  # a block with global scale g holds values up to CAP * g
# NVFP4 rounding bound per element, as a fraction of its 16-group's amax: the E4M3 scale
# is off by <= 2**-4 (relative), then E2M1 rounds by <= half a step (1 unit at the top,
# i.e. <= amax / 6 * (1 + 2**-4)), or saturates at 6 losing <= 1 - 1/(1 + 2**-4).
ELEM_TOL = (1 + 2.0**-4) / 6 + 1e-6


def gauss(rng, n, d, scale=1.0):
    return (rng.standard_normal((n, d)) * scale).astype(np.float32)


def group_amax(x):
    """(n, D) -> (n, D): each element's 16-group amax."""
    g = np.abs(x).reshape(x.shape[0], -1, nvfp4.GROUP).max(axis=-1)
    return np.repeat(g, nvfp4.GROUP, axis=-1)


def assert_nvfp4_close(decoded, x):
    """|decoded - x| within NVFP4 rounding of x, element by element (so nothing was clipped)."""
    err = np.abs(decoded.astype(np.float64) - x.astype(np.float64))
    bound = ELEM_TOL * group_amax(x).astype(np.float64)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)}"


def is_pow2(g):
    g = np.asarray(g, dtype=np.float32)
    return bool(np.all((g > 0) & np.isfinite(g) & (np.frexp(g)[0] == 0.5)))


def snapshot(pool):
    """Everything a pool holds: copies of its arrays and its bookkeeping."""
    return ({n: getattr(pool, n).copy() for n in ("keys_fp4", "key_scale", "key_gscale")},
            pool._meta(), pool.sequences, pool.free_blocks)


def assert_same_state(a, b):
    (arr_a, meta_a, seqs_a, free_a), (arr_b, meta_b, seqs_b, free_b) = a, b
    for name in arr_a:
        assert arr_a[name].dtype == arr_b[name].dtype
        np.testing.assert_array_equal(arr_a[name].view(np.uint8), arr_b[name].view(np.uint8), err_msg=name)
    assert meta_a == meta_b
    assert seqs_a == seqs_b and [type(s) for s in seqs_a] == [type(s) for s in seqs_b]
    assert free_a == free_b


def block_decoded(pool, b):
    return nvfp4.dequantize(pool.keys_fp4[b], pool.key_scale[b], pool.key_gscale[b])


# ------------------------------------------------------------------------- construction
def test_new_pool_arrays():
    pool = KeyPool(3)
    assert (pool.num_blocks, pool.entries_per_block, pool.head_dim, pool.device) == (3, 64, 128, "cpu")
    for name, dtype, shape in (("keys_fp4", np.uint8, (3, 64, 64)), ("key_scale", np.uint8, (3, 64, 8)),
                               ("key_gscale", np.float32, (3,))):
        a = getattr(pool, name)
        assert isinstance(a, np.ndarray) and a.dtype == dtype and a.shape == shape
        assert a.flags.c_contiguous
    np.testing.assert_array_equal(pool.key_gscale, np.ones(3, np.float32))
    assert pool.free_blocks == 3 and pool.sequences == []
    assert "KeyPool(num_blocks=3" in repr(pool) and "free_blocks=3" in repr(pool)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(num_blocks=0), ValueError, "num_blocks"),
    (dict(num_blocks=2.0), TypeError, "num_blocks"),
    (dict(num_blocks=True), TypeError, "num_blocks"),
    (dict(num_blocks=2**26, entries_per_block=64), ValueError, "num_blocks"),
    (dict(num_blocks=2, entries_per_block=0), ValueError, "entries_per_block"),
    (dict(num_blocks=2, head_dim=48), ValueError, "head_dim"),
    (dict(num_blocks=2, head_dim=288), ValueError, "head_dim: expected a positive multiple of 32 up to 256"),
    (dict(num_blocks=2, head_dim=0), ValueError, "head_dim"),
    (dict(num_blocks=2, device="tpu"), ValueError, "device"),
    (dict(num_blocks=2, device="cuda:x"), ValueError, "device"),
    (dict(num_blocks=2, device=0), TypeError, "device"),
])
def test_constructor_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        KeyPool(**kwargs)


@pytest.mark.skipif(arrays.gpu_available(), reason="checks the no-GPU error")
def test_cuda_device_without_gpu():
    with pytest.raises(RuntimeError, match="CuPy"):
        KeyPool(2, device="cuda:0")


# ------------------------------------------------------------------------- appending
def test_append_fills_last_block_first():
    rng = np.random.default_rng(1)
    pool = KeyPool(6, entries_per_block=4, head_dim=32)
    a1, b1, a2 = gauss(rng, 3, 32), gauss(rng, 2, 32), gauss(rng, 3, 32)
    assert pool.append("a", a1) == 3
    assert pool.append("b", b1) == 2
    assert pool.append("a", a2) == 6  # 1 key tops up block 0, the other 2 open block 2
    np.testing.assert_array_equal(pool.block_table(["a", "b"]), [[0, 2], [1, -1]])
    # the first new key sits in block 0, slot 3; the next two in block 2, slots 0-1
    np.testing.assert_array_equal(pool.keys("a")[3], block_decoded(pool, 0)[3])
    np.testing.assert_array_equal(pool.keys("a")[4:], block_decoded(pool, 2)[:2])
    assert pool.append("a", gauss(rng, 2, 32)) == 8  # fills block 2 exactly: no new block
    assert pool.block_table(["a"]).tolist() == [[0, 2]] and pool.free_blocks == 3
    assert pool.append("a", gauss(rng, 1, 32)[0]) == 9  # a (D,) key; opens block 3
    assert pool.block_table(["a"]).tolist() == [[0, 2, 3]]
    assert pool.sequences == ["a", "b"]


def test_append_empty_is_a_noop():
    rng = np.random.default_rng(2)
    pool = KeyPool(2, entries_per_block=4, head_dim=32)
    before = snapshot(pool)
    assert pool.append("x", np.zeros((0, 32), np.float32)) == 0
    assert_same_state(before, snapshot(pool))
    assert pool.sequences == []
    pool.append("x", gauss(rng, 2, 32))
    assert pool.append("x", np.zeros((0, 32))) == 2


def test_block_table_and_lengths():
    rng = np.random.default_rng(3)
    pool = KeyPool(8, entries_per_block=4, head_dim=32)
    pool.append(7, gauss(rng, 5, 32))
    pool.append(np.int64(9), gauss(rng, 9, 32))  # NumPy ints are ids too, stored as int
    assert pool.sequences == [7, 9] and type(pool.sequences[1]) is int
    bt = pool.block_table([7, "unknown", 9])
    assert bt.dtype == np.int32 and bt.shape == (3, 3) and bt.flags.c_contiguous
    np.testing.assert_array_equal(bt, [[0, 1, -1], [-1, -1, -1], [2, 3, 4]])
    lens = pool.lengths([7, "unknown", 9])
    assert lens.dtype == np.int32 and lens.tolist() == [5, 0, 9]
    assert pool.length(9) == 9 and pool.length("unknown") == 0
    wide = pool.block_table([9, 7], width=5)
    np.testing.assert_array_equal(wide, [[2, 3, 4, -1, -1], [0, 1, -1, -1, -1]])
    assert pool.block_table([]).shape == (0, 1)
    assert pool.block_table(["nobody"]).tolist() == [[-1]]
    assert pool.block_table(np.array([9])).tolist() == [[2, 3, 4]]
    assert pool.keys("nobody").shape == (0, 32)
    with pytest.raises(ValueError, match="width"):
        pool.block_table([7, 9], width=2)
    with pytest.raises(TypeError, match="width"):
        pool.block_table([7], width=2.5)
    with pytest.raises(ValueError, match=r"width: \d+ blocks of \d+ entries exceed"):  # a row's entries are bounded
        pool.block_table([7], width=indexer.MAX_ROW_ENTRIES // pool.entries_per_block + 1)
    for bad in ("ab", 7, object()):
        with pytest.raises(TypeError, match="seqs"):
            pool.block_table(bad)
    with pytest.raises(TypeError, match="seqs"):
        pool.lengths([7, 1.5])


def test_keys_are_the_exact_decode_of_the_pool_and_close_to_input():
    rng = np.random.default_rng(4)
    pool = KeyPool(16, entries_per_block=8, head_dim=64)
    chunks = [gauss(rng, n, 64, s) for n, s in ((5, 1.0), (11, 3.0), (1, 0.5), (20, 1e-3))]
    for c in chunks:
        pool.append("s", c)
    x = np.concatenate(chunks)
    k = pool.keys("s")
    assert k.dtype == np.float32 and k.shape == x.shape
    b = pool.block_table(["s"])[0]
    b = b[b >= 0]
    expected = nvfp4.dequantize(pool.keys_fp4[b], pool.key_scale[b], pool.key_gscale[b][:, None])
    np.testing.assert_array_equal(k.view(np.uint32), expected.reshape(-1, 64)[: len(x)].view(np.uint32))
    assert_nvfp4_close(k, x)
    assert np.linalg.norm(k - x) / np.linalg.norm(x) < 0.12
    # float64 and float16 keys are accepted (cast to float32)
    pool2 = KeyPool(2, entries_per_block=8, head_dim=64)
    pool2.append("d", chunks[0].astype(np.float64))
    pool2.append("h", chunks[0].astype(np.float16))
    np.testing.assert_array_equal(pool2.keys("d"), pool.keys("s")[:5])
    assert_nvfp4_close(pool2.keys("h"), chunks[0].astype(np.float16).astype(np.float32))


def test_global_scale_is_the_smallest_covering_power_of_two():
    rng = np.random.default_rng(5)
    E, D = 4, 32
    pool = KeyPool(12, entries_per_block=E, head_dim=D)
    for seq, scale in enumerate((1e-3, 1.0, 7.0, 3e4)):
        x = gauss(rng, 2 * E, D, scale)  # whole blocks, each written in one go
        pool.append(seq, x)
        for i, b in enumerate(pool.block_table([seq])[0]):
            g = pool.key_gscale[b]
            amax = np.abs(x[i * E:(i + 1) * E]).max()
            assert is_pow2(g)
            assert amax <= CAP * g and amax > CAP * g / 2, (scale, amax, g)
        assert_nvfp4_close(pool.keys(seq), x)
    np.testing.assert_array_equal(pool.key_gscale[8:], np.ones(4, np.float32))  # unused


def test_growth_keeps_old_entries_bit_identical():
    rng = np.random.default_rng(6)
    pool = KeyPool(2, entries_per_block=8, head_dim=64)
    old = gauss(rng, 3, 64)
    pool.append("a", old)
    g0 = float(pool.key_gscale[0])
    codes0, scales0 = pool.keys_fp4[0, :3].copy(), pool.key_scale[0, :3].copy()
    dec0 = pool.keys("a").copy()
    big = gauss(rng, 1, 64, 60.0)
    assert np.abs(big).max() > CAP * g0  # the premise: at g0 this key would be clipped
    pool.append("a", big)
    g1 = float(pool.key_gscale[0])
    assert pool.block_table(["a"]).tolist() == [[0]]  # same block
    m = np.log2(g1 / g0)
    assert is_pow2(g1) and m >= 1 and m == int(m)
    assert CAP * g1 / 2 < np.abs(big).max() <= CAP * g1  # smallest power of two that covers
    # old entries: codes unchanged, scales divided by 2**m, decoded values bit-identical
    np.testing.assert_array_equal(pool.keys_fp4[0, :3], codes0)
    np.testing.assert_array_equal(nvfp4.e4m3_decode(pool.key_scale[0, :3]) * 2.0**m, nvfp4.e4m3_decode(scales0))
    np.testing.assert_array_equal(pool.keys("a")[:3].view(np.uint32), dec0.view(np.uint32))
    # the new key is not clipped: NVFP4 rounding only, its amax kept
    new = pool.keys("a")[3:]
    assert_nvfp4_close(new, big)
    assert np.abs(new).max() >= np.abs(big).max() * (1 - 2.0**-4)
    # a later small key uses the grown scale and is still within NVFP4 rounding of its groups
    small = gauss(rng, 1, 64, 0.5)
    pool.append("a", small)
    assert float(pool.key_gscale[0]) == g1
    assert_nvfp4_close(pool.keys("a")[4:], small)


def test_growth_requantizes_only_groups_leaving_e4m3():
    rng = np.random.default_rng(7)
    D = 64
    pool = KeyPool(1, entries_per_block=4, head_dim=D)
    x = gauss(rng, 2, D)
    x[:, 16:32] *= 2.0**-7  # a group far below the others: its scale will not survive / 2**m
    pool.append("a", x)
    g0 = float(pool.key_gscale[0])
    codes0, scales0 = pool.keys_fp4[0, :2].copy(), pool.key_scale[0, :2].copy()
    dec0 = pool.keys("a").copy()
    big = gauss(rng, 1, D, 2.0**10)
    pool.append("a", big)
    g1 = float(pool.key_gscale[0])
    m = int(np.log2(g1 / g0))
    # which groups can be rescaled exactly, decided independently of the codec (ml_dtypes)
    s0 = nvfp4.e4m3_decode(scales0).astype(np.float64)  # (2, 4)
    shifted = s0 / 2.0**m
    exact = shifted.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64) == shifted
    assert exact.any() and not exact.all()  # the premise: both kinds are present
    assert not exact[:, 1].any() and exact[:, [0, 2, 3]].all()
    keep = np.repeat(exact, 16, axis=1)  # (2, D)
    dec1 = pool.keys("a")[:2]
    np.testing.assert_array_equal(dec1[keep], dec0[keep])  # exactly rescaled groups: bit-identical
    np.testing.assert_array_equal(np.unpackbits(pool.keys_fp4[0, :2], axis=1).reshape(2, 4, -1)[exact],
                                  np.unpackbits(codes0, axis=1).reshape(2, 4, -1)[exact])
    # the others: re-quantized from their exact decoded values with the new scale
    c, s, _ = nvfp4.quantize(dec0, np.float32(g1))
    requant = nvfp4.dequantize(c, s, np.float32(g1))
    np.testing.assert_array_equal(dec1[~keep], requant[~keep])
    assert_nvfp4_close(pool.keys("a")[2:], big)


@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_zero_block_takes_scale_from_first_nonzero_keys(scale):
    rng = np.random.default_rng(8)
    pool = KeyPool(1, entries_per_block=8, head_dim=32)
    pool.append("z", np.zeros((2, 32), np.float32))
    assert float(pool.key_gscale[0]) == 1.0 and not pool.key_scale[0].any()
    x = gauss(rng, 3, 32, scale)
    pool.append("z", x)
    g = float(pool.key_gscale[0])
    assert is_pow2(g) and CAP * g / 2 < np.abs(x).max() <= CAP * g  # from x alone, not 1.0
    k = pool.keys("z")
    assert not k[:2].any()
    assert_nvfp4_close(k[2:], x)


def test_tiny_keys_keep_a_normal_global_scale():
    pool = KeyPool(1, entries_per_block=2, head_dim=32)
    x = np.full((1, 32), 1e-40, np.float32)  # float32 subnormals
    x[0, ::2] *= -1
    pool.append(0, x)
    assert float(pool.key_gscale[0]) == 2.0**-126


def test_free_then_reuse():
    rng = np.random.default_rng(9)
    pool = KeyPool(4, entries_per_block=4, head_dim=32)
    pool.append("a", gauss(rng, 6, 32))  # blocks 0, 1
    pool.append("b", gauss(rng, 4, 32))  # block 2
    kb = pool.keys("b").copy()
    pool.free("a")
    assert pool.sequences == ["b"] and pool.free_blocks == 3 and pool.length("a") == 0
    assert not pool.keys_fp4[:2].any() and not pool.key_scale[:2].any()
    np.testing.assert_array_equal(pool.key_gscale[:2], [1.0, 1.0])
    with pytest.raises(ValueError, match="seq.*'a'"):
        pool.free("a")
    with pytest.raises(ValueError, match="seq"):
        pool.free(12)
    c = gauss(rng, 9, 32, 5.0)
    pool.append("c", c)  # LIFO: a's blocks come back first, in a's order, then block 3
    assert pool.block_table(["c"]).tolist() == [[0, 1, 3]] and pool.free_blocks == 0
    assert_nvfp4_close(pool.keys("c"), c)
    np.testing.assert_array_equal(pool.keys("b"), kb)
    pool.free("b")
    pool.append("a", gauss(rng, 1, 32))  # a re-registered: it now comes after c
    assert pool.sequences == ["c", "a"] and pool.block_table(["a"]).tolist() == [[2]]


def test_pool_full_changes_nothing():
    rng = np.random.default_rng(10)
    pool = KeyPool(3, entries_per_block=4, head_dim=32)
    pool.append("a", gauss(rng, 5, 32))  # blocks 0, 1; 3 slots left in block 1
    before = snapshot(pool)
    with pytest.raises(PoolFullError, match="need 2 free blocks.* 1 free"):
        pool.append("a", gauss(rng, 8, 32, 100.0))  # 3 into block 1, 5 need 2 more blocks
    assert_same_state(before, snapshot(pool))
    with pytest.raises(PoolFullError, match="need 2"):
        pool.append("new", gauss(rng, 5, 32))
    assert_same_state(before, snapshot(pool))
    assert isinstance(PoolFullError("x"), RuntimeError)
    assert pool.append("a", gauss(rng, 7, 32)) == 12  # exactly what is left fits
    assert pool.free_blocks == 0


@pytest.mark.parametrize("seq, keys, exc, match", [
    ("a", np.ones((2, 32), np.int32), TypeError, "keys"),
    ("a", np.ones((2, 32), bool), TypeError, "keys"),
    ("a", [["x"] * 32], TypeError, "keys"),
    ("a", [[1.0] * 32, [1.0] * 31], TypeError, "keys: expected a float array, got a list NumPy cannot read"),
    ("a", np.ones((2, 16), np.float32), ValueError, "keys"),
    ("a", np.ones((1, 2, 32), np.float32), ValueError, "keys"),
    ("a", np.float32(1.0), ValueError, "keys"),
    ("a", np.array([[np.nan] + [1.0] * 31], np.float32), ValueError, "keys: NaN or Inf cannot be encoded"),
    ("a", np.array([[-np.inf] + [1.0] * 31], np.float32), ValueError, "NaN or Inf"),
    ("a", np.full((1, 32), 1e300), ValueError, "NaN or Inf"),  # float64 beyond float32
    # finite float32 keys whose block scale 2**117 could decode past float32's largest
    ("a", np.array([[3.4e38, -3.4e38] + [0.0] * 30], np.float32), ValueError, r"keys: magnitudes above 2\.233e\+38"),
    (1.5, np.ones((1, 32), np.float32), TypeError, "seq"),
    (True, np.ones((1, 32), np.float32), TypeError, "seq"),
    (None, np.ones((1, 32), np.float32), TypeError, "seq"),
    (b"a", np.ones((1, 32), np.float32), TypeError, "seq"),
])
def test_append_validation(seq, keys, exc, match):
    rng = np.random.default_rng(11)
    pool = KeyPool(2, entries_per_block=4, head_dim=32)
    pool.append("a", gauss(rng, 2, 32))
    before = snapshot(pool)
    with pytest.raises(exc, match=match):
        pool.append(seq, keys)
    assert_same_state(before, snapshot(pool))


def test_largest_storable_keys_decode_finite():
    """Keys at the largest magnitude the pool takes decode to finite values within NVFP4's
    rounding of them, in a new block and into an existing one (its scale grown)."""
    from indexer.keywrite import MAX_KEY as _MAX_KEY  # noqa: PLC0415

    big = np.float32(_MAX_KEY)
    assert float(big) <= _MAX_KEY
    pool = KeyPool(2, entries_per_block=4, head_dim=32)
    pool.append("a", np.array([[1.0] * 32], np.float32))
    pool.append("a", np.array([[big, -big] + [1e30] * 30], np.float32))
    pool.append("b", np.array([[big * np.float32(0.999), -big] + [0.0] * 30], np.float32))
    for seq in ("a", "b"):
        keys = pool.keys(seq)
        assert np.isfinite(keys).all()
        assert np.abs(keys).max() <= _MAX_KEY


def test_other_methods_validate_seq():
    pool = KeyPool(1, entries_per_block=4, head_dim=32)
    for call in (pool.length, pool.keys, pool.free):
        with pytest.raises(TypeError, match="seq"):
            call(2.0)


# ------------------------------------------------------------------------- files
def busy_pool(rng):
    """A pool with int and str ids, a freed sequence, partly filled blocks and grown scales."""
    pool = KeyPool(10, entries_per_block=4, head_dim=32)
    pool.append("s", gauss(rng, 6, 32))
    pool.append(3, gauss(rng, 3, 32, 0.01))
    pool.append("3", gauss(rng, 9, 32, 100.0))
    pool.append("s", gauss(rng, 1, 32, 1000.0))  # grows block 1's g
    pool.free(3)
    pool.append(-4, gauss(rng, 2, 32))
    return pool


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_save_load_round_trip(tmp_path, suffix):
    if suffix == ".safetensors":
        pytest.importorskip("safetensors")
    rng = np.random.default_rng(12)
    pool = busy_pool(rng)
    path = tmp_path / f"pool{suffix}"
    pool.save(path)
    assert path.exists() and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    loaded = KeyPool.load(str(path))
    assert_same_state(snapshot(pool), snapshot(loaded))
    assert loaded.sequences == ["s", "3", -4]
    for name in ("keys_fp4", "key_scale", "key_gscale"):
        assert getattr(loaded, name).flags.c_contiguous
    for s in pool.sequences:
        np.testing.assert_array_equal(loaded.keys(s), pool.keys(s))
    # both behave the same from here on (same free-list order, same growth)
    x = gauss(rng, 7, 32, 50.0)
    pool.append("s", x)
    loaded.append("s", x)
    assert_same_state(snapshot(pool), snapshot(loaded))


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_a_save_that_fails_part_way_leaves_the_file_there_whole(tmp_path, monkeypatch, suffix):
    if suffix == ".safetensors":
        safetensors = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(13)
    old, new = busy_pool(rng), KeyPool(2, entries_per_block=4, head_dim=32)
    new.append("x", gauss(rng, 5, 32))
    path = tmp_path / f"pool{suffix}"
    old.save(path)
    before = path.read_bytes()

    def half_then_full_disk(target, *args, **kwargs):  # np.savez(file, ...) / save_file(tensors, name, ...)
        name = target if isinstance(target, str) else target.name
        with open(name, "wb") as f:
            f.write(before[: len(before) // 2])
        raise OSError(28, "No space left on device")

    if suffix == ".npz":
        monkeypatch.setattr(np, "savez", half_then_full_disk)
    else:
        monkeypatch.setattr(safetensors, "save_file", lambda tensors, name, **kw: half_then_full_disk(name))
    with pytest.raises(OSError, match="No space left"):
        new.save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]
    monkeypatch.undo()
    assert_same_state(snapshot(old), snapshot(KeyPool.load(path)))
    new.save(path)  # and a save that succeeds replaces it
    assert_same_state(snapshot(new), snapshot(KeyPool.load(path)))


def test_save_and_load_need_a_known_suffix(tmp_path):
    pool = KeyPool(1, entries_per_block=4, head_dim=32)
    with pytest.raises(ValueError, match="path"):
        pool.save(tmp_path / "pool.pt")
    with pytest.raises(ValueError, match="path"):
        KeyPool.load(tmp_path / "pool.bin")


def test_append_and_free_take_a_stream_and_check_it_on_the_cpu(rng):
    """A CPU pool checks ``stream=`` (named on error) and ignores it, as score_topk does."""
    pool = KeyPool(4, entries_per_block=4, head_dim=32)
    assert pool.append("a", gauss(rng, 3, 32), stream=None) == 3
    with pytest.raises(TypeError, match="^stream"):
        pool.append("a", gauss(rng, 1, 32), stream="side")
    assert pool.length("a") == 3
    with pytest.raises(TypeError, match="^stream"):
        pool.free("a", stream=1.5)
    assert pool.length("a") == 3
    pool.free("a", stream=None)
    assert pool.length("a") == 0


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npz: no such file"):
        KeyPool.load(tmp_path / "nope.npz")
    (tmp_path / "dir.npz").mkdir()
    with pytest.raises(IsADirectoryError, match="dir.npz: not a file"):
        KeyPool.load(tmp_path / "dir.npz")


def test_load_bad_device(tmp_path):
    path = tmp_path / "p.npz"
    KeyPool(1, entries_per_block=4, head_dim=32).save(path)
    with pytest.raises(ValueError, match="device"):
        KeyPool.load(path, device="gpu")


def test_safetensors_missing_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # makes `import safetensors` fail
    pool = KeyPool(1, entries_per_block=4, head_dim=32)
    with pytest.raises(ImportError, match="safetensors"):
        pool.save(tmp_path / "p.safetensors")
    (tmp_path / "q.safetensors").write_bytes(b"x")
    with pytest.raises(ImportError, match="pip install"):
        KeyPool.load(tmp_path / "q.safetensors")


def pool_parts(rng):
    """A saved pool's arrays and metadata, to corrupt one thing at a time."""
    pool = KeyPool(4, entries_per_block=4, head_dim=32)
    pool.append("a", gauss(rng, 6, 32))
    pool.append("b", gauss(rng, 1, 32))
    tensors = {n: getattr(pool, n).copy() for n in ("keys_fp4", "key_scale", "key_gscale")}
    return tensors, pool._meta()


def write_npz(path, tensors, meta):
    extra = {}
    if meta is not None:
        raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
        extra["pool_meta"] = np.frombuffer(raw, np.uint8)
    np.savez(path, **tensors, **extra)


def test_load_accepts_the_unmodified_parts(tmp_path):
    tensors, meta = pool_parts(np.random.default_rng(13))
    write_npz(tmp_path / "ok.npz", tensors, meta)
    pool = KeyPool.load(tmp_path / "ok.npz")
    assert pool.sequences == ["a", "b"] and pool.lengths(["a", "b"]).tolist() == [6, 1]


def _drop(d, k):
    del d[k]


def _set_seq(i, key, value):
    def edit(t, m):
        m["sequences"][i][key] = value
    return edit


@pytest.mark.parametrize("edit, match", [
    (lambda t, m: _drop(t, "key_scale"), r"missing array.*key_scale"),
    (lambda t, m: t.update(extra=np.zeros(3)), r"unexpected array.*extra"),
    (lambda t, m: t.update(keys_fp4=t["keys_fp4"][:, :, :8].copy()), "keys_fp4: expected uint8"),
    (lambda t, m: t.update(key_scale=t["key_scale"].astype(np.int8)), "key_scale: expected uint8"),
    (lambda t, m: t.update(key_gscale=t["key_gscale"].astype(np.float64)), "key_gscale: expected float32"),
    (lambda t, m: t["key_gscale"].__setitem__(0, 0.3), "key_gscale: expected powers of two"),
    (lambda t, m: t["key_gscale"].__setitem__(0, 2.0**117), "key_gscale: expected powers of two in"),  # decodes to inf
    (lambda t, m: t["key_gscale"].__setitem__(3, 0.0), "key_gscale"),
    (lambda t, m: t["key_gscale"].__setitem__(1, np.inf), "key_gscale"),
    (lambda t, m: t["key_scale"].__setitem__((0, 0, 0), 0x7F), "key_scale: negative or NaN"),
    (lambda t, m: m.update(version=99), "pool_meta: expected"),
    (lambda t, m: m.update(format="other"), "pool_meta: expected"),
    (lambda t, m: m.update(head_dim=64), "keys_fp4: expected"),
    (lambda t, m: m.update(head_dim=33), "pool_meta: head_dim"),
    (lambda t, m: m.update(num_blocks="4"), "pool_meta: num_blocks"),
    (lambda t, m: m.update(sequences={}), "'sequences' and 'free'"),
    (lambda t, m: m.update(free=None), "'sequences' and 'free'"),
    (lambda t, m: m["sequences"].append(["c", 1, [3]]), "sequence entry"),
    (lambda t, m: m["sequences"][0].update(extra=1), "sequence entry"),
    (_set_seq(0, "length", 9), "'a': length 9 needs"),  # 9 keys need 3 blocks, 2 listed
    (_set_seq(0, "length", 4), "'a': length 4 needs"),  # 4 keys need 1 block
    (_set_seq(1, "length", 0), "'b': length 0"),
    (_set_seq(1, "length", 1.0), "'b': length 1.0"),
    (_set_seq(1, "blocks", 2), "'b'"),
    (_set_seq(1, "id", "a"), "sequence id 'a' is not a unique"),
    (_set_seq(1, "id", 1.5), "sequence id 1.5"),
    (_set_seq(1, "id", None), "sequence id None"),
    (_set_seq(1, "blocks", [0]), "block 0 belongs to both sequence 'a' and sequence 'b'"),
    (_set_seq(1, "blocks", [4]), "block id 4 of sequence 'b' is not an int in"),
    (_set_seq(1, "blocks", [-1]), "block id -1"),
    (_set_seq(1, "blocks", [True]), "block id True"),
    (lambda t, m: m["free"].append(0), "block 0 belongs to both sequence 'a' and the free list"),
    (lambda t, m: m["free"].pop(), r"blocks \[3\] are neither in a sequence nor free"),
])
def test_load_rejects_inconsistent_files(tmp_path, edit, match):
    tensors, meta = pool_parts(np.random.default_rng(14))
    edit(tensors, meta)
    path = tmp_path / "bad.npz"
    write_npz(path, tensors, meta)
    with pytest.raises(ValueError, match=match) as info:
        KeyPool.load(path)
    assert "bad.npz" in str(info.value)


@pytest.mark.parametrize("meta, match", [
    (None, "missing pool_meta"),
    (b"\xff\xfe{", "not UTF-8 JSON"),
    (b"{not json", "not UTF-8 JSON"),
    (b"[1, 2]", "pool_meta: expected"),
])
def test_load_rejects_bad_meta(tmp_path, meta, match):
    tensors, _ = pool_parts(np.random.default_rng(15))
    write_npz(tmp_path / "m.npz", tensors, meta)
    with pytest.raises(ValueError, match=match):
        KeyPool.load(tmp_path / "m.npz")


def test_load_rejects_meta_of_wrong_dtype(tmp_path):
    tensors, meta = pool_parts(np.random.default_rng(16))
    raw = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(tmp_path / "m.npz", **tensors, pool_meta=raw.astype(np.int16))
    with pytest.raises(ValueError, match="pool_meta: expected a 1-D uint8"):
        KeyPool.load(tmp_path / "m.npz")


UNPICKLED = []


class Trap:
    """Records being unpickled: np.load must refuse before that can happen."""

    def __setstate__(self, state):
        UNPICKLED.append(state)


@pytest.mark.parametrize("where", ["pool_meta", "extra", "keys_fp4"])
def test_load_never_unpickles(tmp_path, where):
    tensors, meta = pool_parts(np.random.default_rng(17))
    trap = np.empty(1, dtype=object)
    trap[0] = Trap()
    raw = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    contents = {**tensors, "pool_meta": raw}
    contents[where] = trap
    path = tmp_path / "pickle.npz"
    np.savez(path, **contents)
    with pytest.raises(ValueError, match="pickle.npz"):
        KeyPool.load(path)
    assert UNPICKLED == []


def test_load_rejects_files_that_are_not_npz(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"this is not a zip archive")
    with pytest.raises(ValueError, match="junk.npz: not a readable .npz"):
        KeyPool.load(tmp_path / "junk.npz")
    with open(tmp_path / "single.npz", "wb") as f:
        np.save(f, np.zeros(3))
    with pytest.raises(ValueError, match="not an .npz archive"):
        KeyPool.load(tmp_path / "single.npz")


def test_load_rejects_bad_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    tensors, meta = pool_parts(np.random.default_rng(18))
    (tmp_path / "junk.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(ValueError, match="junk.safetensors: not a readable"):
        KeyPool.load(tmp_path / "junk.safetensors")
    st.save_file(tensors, str(tmp_path / "nometa.safetensors"))
    with pytest.raises(ValueError, match="missing pool_meta"):
        KeyPool.load(tmp_path / "nometa.safetensors")
    st.save_file({**tensors, "x": np.zeros(2, np.float32)}, str(tmp_path / "extra.safetensors"),
                 metadata={"pool_meta": json.dumps(meta)})
    with pytest.raises(ValueError, match="unexpected array"):
        KeyPool.load(tmp_path / "extra.safetensors")
    meta["sequences"][0]["length"] = 3
    st.save_file(tensors, str(tmp_path / "len.safetensors"), metadata={"pool_meta": json.dumps(meta)})
    with pytest.raises(ValueError, match="len.safetensors: pool_meta: sequence 'a': length 3"):
        KeyPool.load(pathlib.Path(tmp_path / "len.safetensors"))


# ------------------------------------------------------------------------- scoring
def test_score_topk_matches_the_reference():
    rng = np.random.default_rng(19)
    E, D, H = 8, 64, 4
    pool = KeyPool(16, entries_per_block=E, head_dim=D)
    pool.append("a", gauss(rng, 21, D))
    pool.append("b", gauss(rng, 5, D, 3.0))
    pool.append("a", gauss(rng, 6, D, 40.0))  # grows a block's g mid-sequence
    pool.append("c", gauss(rng, 40, D, 0.1))
    pool.free("b")
    pool.append("d", gauss(rng, 13, D))  # reuses b's block
    seqs = ["a", "c", "d", "a", "none"]
    T, top_k = len(seqs), 12
    q = gauss(rng, T * H, D).reshape(T, H, D)
    w = gauss(rng, T, H)
    bt, lens = pool.block_table(seqs), pool.lengths(seqs)
    idx, sc = pool.score_topk(q, w, seqs, top_k, backend="numpy", return_scores=True)
    ref_idx, ref_sc = reference.score_topk(q, w, pool.keys_fp4, pool.key_scale, pool.key_gscale, bt, lens,
                                           top_k, return_scores=True)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(sc, ref_sc)
    assert (idx[4] == -1).all() and (idx[:4] >= 0).all()
    problem = Problem(q=q, w=w, keys_fp4=pool.keys_fp4, key_scale=pool.key_scale, key_gscale=pool.key_gscale,
                      block_table=bt, valid_lens=lens, top_k=top_k)
    check_topk(problem, idx, sc)
    phys = pool.score_topk(q, w, seqs, top_k, backend="numpy", physical=True)
    check_topk(problem, phys, physical=True)
    np.testing.assert_array_equal(phys, reference.to_physical(idx, bt, E))
    # the scores come from the decoded keys: recompute one row directly
    k = pool.keys("c").astype(np.float64)
    s = w[1].astype(np.float64) @ np.maximum(q[1].astype(np.float64) @ k.T, 0)
    np.testing.assert_allclose(sc[1], np.sort(s)[::-1][:top_k], rtol=1e-6)
    with pytest.raises(ValueError, match="seqs"):
        pool.score_topk(q, w, seqs[:-1], top_k, backend="numpy")


def test_from_arrays_equals_load(tmp_path):
    from indexer import io as indexer_io

    rng = np.random.default_rng(91)
    pool = KeyPool(6, entries_per_block=8, head_dim=32)
    pool.append("x", rng.standard_normal((13, 32)).astype(np.float32))
    pool.append(7, rng.standard_normal((3, 32)).astype(np.float32))
    path = tmp_path / "pool.npz"
    pool.save(path)
    loaded = KeyPool.load(path)
    rebuilt = KeyPool.from_arrays(indexer_io.read_arrays(path))
    for name in ("keys_fp4", "key_scale", "key_gscale"):
        np.testing.assert_array_equal(getattr(rebuilt, name), getattr(loaded, name))
    assert rebuilt.sequences == loaded.sequences == ["x", 7]
    np.testing.assert_array_equal(rebuilt.block_table(["x", 7]), loaded.block_table(["x", 7]))


def test_from_arrays_copies_the_callers_arrays(tmp_path):
    """The pool writes its own copies: appends and frees leave the dict it came from alone,
    read-only arrays included."""
    from indexer import io as indexer_io

    rng = np.random.default_rng(92)
    pool = KeyPool(6, entries_per_block=8, head_dim=32)
    pool.append("x", rng.standard_normal((13, 32)).astype(np.float32))
    path = tmp_path / "pool.npz"
    pool.save(path)
    given = indexer_io.read_arrays(path)
    for a in given.values():
        a.flags.writeable = False
    before = {k: v.copy() for k, v in given.items()}
    rebuilt = KeyPool.from_arrays(given)
    rebuilt.append("y", rng.standard_normal((9, 32)).astype(np.float32) * 100)
    rebuilt.free("x")
    for k, v in given.items():
        np.testing.assert_array_equal(v, before[k])


def test_a_failed_write_loses_no_block_and_no_sequence(monkeypatch):
    """append takes its blocks off the free list, and free drops its sequence, only once
    the writes went through: an error in between (out of memory) leaves the books whole."""
    rng = np.random.default_rng(93)
    pool = KeyPool(6, entries_per_block=4, head_dim=32)
    pool.append("a", gauss(rng, 6, 32))
    before = snapshot(pool)

    def fail(*args):
        raise MemoryError("no room")

    monkeypatch.setattr(KeyPool, "_write_new", fail)
    with pytest.raises(MemoryError):
        pool.append("b", gauss(rng, 9, 32))
    assert pool.free_blocks == 4 and pool.sequences == ["a"]
    monkeypatch.undo()
    assert pool.append("b", gauss(rng, 9, 32)) == 9 and pool.free_blocks == 1
    pool.free("b")
    assert_same_state(before, snapshot(pool))
    pool.keys_fp4.flags.writeable = False  # the zeroing fails
    with pytest.raises(ValueError):
        pool.free("a")
    assert pool.sequences == ["a"] and pool.length("a") == 6 and pool.free_blocks == 4


def test_from_arrays_rejects_bad_input():
    with pytest.raises(TypeError, match="arrays: expected a dict"):
        KeyPool.from_arrays([1, 2])
    with pytest.raises(ValueError, match="mine: missing array"):
        KeyPool.from_arrays({"keys_fp4": np.zeros((1, 1, 16), np.uint8)}, name="mine")
    with pytest.raises(ValueError, match="pool_meta: expected a 1-D uint8"):
        KeyPool.from_arrays({"pool_meta": np.zeros((2, 2), np.float32)})


# --------------------------------------------------------------- boundaries (found by mutation testing)


@pytest.mark.parametrize("amax,g", [(2688.0, 1.0), (1344.0, 0.5), (2688.0 * 2**-20, 2**-20)])
def test_a_block_at_exactly_its_capacity_takes_the_smaller_scale(amax, g):
    """The policy's scale is the smallest power of two g with amax <= 6 * 448 * g: at
    equality, g itself (one bit more of precision than the next), and the key exact."""
    pool = KeyPool(1, 4, 32)
    x = np.zeros((1, 32), np.float32)
    x[0, 3] = -amax
    pool.append(0, x)
    assert float(pool.key_gscale[0]) == g
    np.testing.assert_array_equal(pool.keys(0), x)


def test_block_table_width_exactly_at_the_row_limit():
    E = 2**20
    width = indexer.MAX_ROW_ENTRIES // E
    assert KeyPool(1, E, 32).block_table([0], width=width).shape == (1, width)


def test_the_largest_storable_keys_survive_save_and_load(tmp_path):
    from indexer.keywrite import MAX_KEY as _MAX_KEY  # noqa: PLC0415

    pool = KeyPool(1, 4, 32)
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = np.float32(_MAX_KEY)
    pool.append(0, x)
    pool.save(tmp_path / "p.npz")
    np.testing.assert_array_equal(KeyPool.load(tmp_path / "p.npz").keys(0), pool.keys(0))


def test_the_free_lists_order_survives_save_and_load(tmp_path):
    """Blocks are reused last freed first; a loaded pool hands them out in the same order."""
    rng = np.random.default_rng(0)
    pool = KeyPool(4, 4, 32)
    pool.append("a", gauss(rng, 6, 32))
    pool.append("b", gauss(rng, 4, 32))
    pool.free("a")
    pool.free("b")
    pool.save(tmp_path / "p.npz")
    back = KeyPool.load(tmp_path / "p.npz")
    c = gauss(rng, 9, 32)
    pool.append("c", c)
    back.append("c", c)
    assert back.block_table(["c"]).tolist() == pool.block_table(["c"]).tolist() == [[2, 0, 1]]


def test_a_block_whose_first_row_is_zero_still_rescales_its_keys():
    """A zero first key leaves the block's scale to the next key; a later, larger key grows
    it and rescales the keys already there (not only row 0 decides whether any exist)."""
    pool = KeyPool(1, 8, 32)
    x = np.zeros((3, 32), np.float32)
    x[1], x[2] = 1.0, 50.0
    for row in x:
        pool.append("s", row)
    np.testing.assert_allclose(pool.keys("s"), x, rtol=0.3)


# ----------------------------------------------------------------------------- append_many
@pytest.mark.parametrize("D, E", [(32, 1), (64, 16), (128, 64), (256, 8)])
def test_append_many_equals_appends_in_order(D, E):
    """append_many gives the blocks, bytes, lengths and free list of append called for each
    sequence in turn, over adversarial keys (growth, re-quantized groups, zeros, -0.0)."""
    from tests.pool_steps import append_steps

    rng = np.random.default_rng(D + E)
    one, many = KeyPool(400, entries_per_block=E, head_dim=D), KeyPool(400, entries_per_block=E, head_dim=D)
    seqs = [0, "b", 2, "d", 4]
    for chosen, keys, counts in append_steps(rng, D, E, seqs, 12):
        want, row = [], 0
        for s, c in zip(chosen, counts):
            want.append(one.append(s, keys[row: row + c]))
            row += c
        got = many.append_many(chosen, keys, counts)
        assert got.dtype == np.int64 and got.tolist() == want
    assert_same_state(snapshot(one), snapshot(many))
    assert many.sequences == one.sequences and many._free == one._free


def test_append_many_one_key_a_sequence_by_default():
    rng = np.random.default_rng(31)
    pool = KeyPool(8, entries_per_block=4, head_dim=32)
    assert pool.append_many(["a", "b", 7], gauss(rng, 3, 32)).tolist() == [1, 1, 1]
    assert pool.append_many(["b"], gauss(rng, 1, 32)).tolist() == [2]
    assert pool.append_many([], np.zeros((0, 32), np.float32)).tolist() == []
    assert pool.append_many(["z"], np.zeros((0, 32), np.float32), counts=[0]).tolist() == [0]
    assert "z" not in pool.sequences  # no keys: no sequence, as append of none


@pytest.mark.parametrize("seqs, n, counts, exc, match", [
    (["a", "b", "a"], 3, None, ValueError, "seqs: 'a' appears more than once"),
    (["a", "b"], 3, None, ValueError, "keys: 3 rows for 2 sequences; pass counts="),
    (["a", "b"], 3, [1, 1], ValueError, "counts: they sum to 2, but keys has 3 rows"),
    (["a", "b"], 3, [4, -1], ValueError, "counts: expected counts >= 0"),
    (["a", "b"], 3, [3], ValueError, "counts: expected 2 counts"),
    (["a", "b"], 3, [1.0, 2.0], TypeError, "counts: expected ints, got float"),
    (["a", "b"], 3, [True, 2], TypeError, "counts: expected ints, got bool"),
    (["a", "b"], 3, 3, TypeError, "counts: expected a list of 2 ints"),
    (["a", "b"], 3, "12", TypeError, "counts: expected a list of 2 ints"),
    ("ab", 2, None, TypeError, "seqs: expected a list of sequence ids"),
    (["a", 1.5], 2, None, TypeError, "seqs"),
])
def test_append_many_refuses_bad_arguments_and_changes_nothing(seqs, n, counts, exc, match):
    rng = np.random.default_rng(32)
    pool = KeyPool(8, entries_per_block=4, head_dim=32)
    pool.append("a", gauss(rng, 2, 32))
    before = snapshot(pool)
    with pytest.raises(exc, match=match):
        pool.append_many(seqs, gauss(rng, n, 32), counts)
    assert_same_state(before, snapshot(pool))


def test_append_many_takes_counts_as_an_array():
    rng = np.random.default_rng(33)
    a, b = KeyPool(8, entries_per_block=4, head_dim=32), KeyPool(8, entries_per_block=4, head_dim=32)
    keys = gauss(rng, 7, 32)
    assert a.append_many(["x", "y"], keys, np.array([5, 2], np.int32)).tolist() == [5, 2]
    assert b.append_many(["x", "y"], keys, (5, 2)).tolist() == [5, 2]
    assert_same_state(snapshot(a), snapshot(b))


def test_append_many_is_all_or_nothing_when_the_pool_is_full():
    rng = np.random.default_rng(34)
    pool = KeyPool(4, entries_per_block=4, head_dim=32)
    pool.append("a", gauss(rng, 3, 32))  # block 0, one slot left
    before = snapshot(pool)
    # "a" fits in its block and "b" in one more block, but "c" needs 3: 4 asked, 3 free
    with pytest.raises(PoolFullError, match="append_many to 3 sequences: 14 keys need 4 free blocks, the pool has 3"):
        pool.append_many(["a", "b", "c"], gauss(rng, 14, 32, 100.0), [1, 4, 9])
    assert_same_state(before, snapshot(pool))
    assert pool.append_many(["a", "b", "c"], gauss(rng, 13, 32), [1, 4, 8]).tolist() == [4, 4, 8]
    assert pool.free_blocks == 0


def test_append_many_on_the_host_checks_its_keys_even_unvalidated():
    pool = KeyPool(4, entries_per_block=4, head_dim=32)
    before = snapshot(pool)
    keys = np.ones((2, 32), np.float32)
    keys[1, 3] = np.nan
    with pytest.raises(ValueError, match="keys: NaN or Inf cannot be encoded"):
        pool.append_many(["a", "b"], keys, validate=False)
    assert_same_state(before, snapshot(pool))


def test_bfloat16_keys_are_written_as_their_float32_values():
    rng = np.random.default_rng(35)
    x = gauss(rng, 40, 64, 3.0).astype(ml_dtypes.bfloat16)
    a, b = KeyPool(8, entries_per_block=16, head_dim=64), KeyPool(8, entries_per_block=16, head_dim=64)
    a.append("s", x[:25])
    a.append_many(["s", "t"], x[25:], [5, 10])
    b.append("s", x[:25].astype(np.float32))
    b.append_many(["s", "t"], x[25:].astype(np.float32), [5, 10])
    assert_same_state(snapshot(a), snapshot(b))
    torch = pytest.importorskip("torch")
    c = KeyPool(8, entries_per_block=16, head_dim=64)
    c.append("s", torch.from_numpy(x[:25].astype(np.float32)).to(torch.bfloat16))
    c.append_many(["s", "t"], torch.from_numpy(x[25:].astype(np.float32)).to(torch.bfloat16), [5, 10])
    assert_same_state(snapshot(b), snapshot(c))


def test_a_key_of_the_wrong_shape_is_named_with_the_shape_given():
    """The message gives the caller's shape, not the (1, n) the pool makes of a 1-D key."""
    pool = KeyPool(2, entries_per_block=4, head_dim=32)
    for keys, shown in ((np.zeros((0,), np.float32), r"\(0,\)"), (np.zeros(16, np.float32), r"\(16,\)"),
                        (np.zeros((2, 3, 32), np.float32), r"\(2, 3, 32\)")):
        with pytest.raises(ValueError, match=rf"^keys: expected shape \(n, 32\) or \(32,\), got {shown}$"):
            pool.append("a", keys)
    assert pool.length("a") == 0
