"""KeyPool on the device holds exactly what the host pool holds, and scores the same."""

import numpy as np
import pytest

from indexer import KeyPool, arrays, testing
from indexer.pool import PoolFullError
from tests.gpu import requires_gpu, side_stream
from tests.pool_steps import append_steps

pytestmark = [requires_gpu, pytest.mark.gpu]


def test_device_pool_equals_host_pool():
    cp = arrays.cupy()
    rng = np.random.default_rng(21)
    host = KeyPool(24, entries_per_block=16, head_dim=64)
    dev = KeyPool(24, entries_per_block=16, head_dim=64, device="cuda")
    for step in range(6):
        for seq in (0, 1, "s2"):
            n = int(rng.integers(1, 20))
            keys = (rng.standard_normal((n, 64)) * np.exp2(step)).astype(np.float32)
            assert host.append(seq, keys) == dev.append(seq, cp.asarray(keys))
    dev.free(1)
    host.free(1)
    more = rng.standard_normal((30, 64)).astype(np.float32)
    host.append(3, more)
    dev.append(3, more)
    assert isinstance(dev.keys_fp4, cp.ndarray)
    for name in ("keys_fp4", "key_scale", "key_gscale"):
        np.testing.assert_array_equal(getattr(host, name), getattr(dev, name).get())
    seqs = [0, "s2", 3, 0]
    np.testing.assert_array_equal(host.block_table(seqs), dev.block_table(seqs).get())
    q = rng.standard_normal((4, 8, 64)).astype(np.float32)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    got = dev.score_topk(cp.asarray(q), cp.asarray(w), seqs, 16)
    problem = testing.Problem(q, w, host.keys_fp4, host.key_scale, host.key_gscale,
                              host.block_table(seqs), host.lengths(seqs), 16)
    testing.check_topk(problem, got.get(), tol=testing.TOL_EXACT)


def test_writes_run_on_the_stream_asked_and_after_the_pools_last_write(monkeypatch):
    """append and free enqueue their writes on ``stream=`` (or, for PyTorch keys, PyTorch's
    current stream: the stream the scoring runs on), each after the pool's previous write on
    whatever stream that ran; the pool then holds what the host pool holds."""
    cp = arrays.cupy()
    seen, waits = [], []
    for name in ("_write_blocks", "_zero_blocks"):
        original = getattr(KeyPool, name)

        def spy(self, *args, _original=original, _name=name):
            if self._xp is not np:  # the device pool's writes (the host pool's zeroing too calls this)
                seen.append((_name, cp.cuda.get_current_stream().ptr))
            return _original(self, *args)

        monkeypatch.setattr(KeyPool, name, spy)
    original_wait = KeyPool._after_last_write

    def wait_spy(self, stream):
        waits.append((stream.ptr, self._last_write is not None))
        return original_wait(self, stream)

    monkeypatch.setattr(KeyPool, "_after_last_write", wait_spy)
    rng = np.random.default_rng(22)
    host = KeyPool(8, entries_per_block=16, head_dim=64)
    dev = KeyPool(8, entries_per_block=16, head_dim=64, device="cuda")
    side, other = side_stream(), side_stream()
    keys = rng.standard_normal((20, 64)).astype(np.float32)
    host.append("a", keys)
    dev.append("a", keys, stream=side)  # two new blocks
    # the first write waits too: for the pool's zero fill, queued on CuPy's current stream
    assert seen == [("_write_blocks", side.ptr)] and waits == [(side.ptr, True)]
    more = rng.standard_normal((5, 64)).astype(np.float32)
    host.append("a", more)
    dev.append("a", more, stream=other)  # into the second block, after the first write
    assert seen[-1] == ("_write_blocks", other.ptr) and waits[-1] == (other.ptr, True)
    torch = pytest.importorskip("torch")
    tside = torch.cuda.Stream()
    last = rng.standard_normal((3, 64)).astype(np.float32)
    host.append("b", last)
    with torch.cuda.stream(tside):
        dev.append("b", torch.from_numpy(last).cuda())
    assert seen[-1] == ("_write_blocks", tside.cuda_stream) and waits[-1] == (tside.cuda_stream, True)
    tside.synchronize()
    for name in ("keys_fp4", "key_scale", "key_gscale"):
        np.testing.assert_array_equal(getattr(host, name), getattr(dev, name).get())
    host.free("a")
    dev.free("a", stream=side)
    assert seen[-1] == ("_zero_blocks", side.ptr) and waits[-1] == (side.ptr, True)
    side.synchronize()
    for name in ("keys_fp4", "key_scale", "key_gscale"):
        np.testing.assert_array_equal(getattr(host, name), getattr(dev, name).get())


def test_a_loaded_pool_orders_its_copies_and_save_waits_for_side_stream_writes(tmp_path):
    """load's host-to-device copies (on CuPy's current stream) come before a write on another
    stream; save, on the host, waits for writes on any stream."""
    rng = np.random.default_rng(23)
    host = KeyPool(64, entries_per_block=16, head_dim=64)
    host.append("a", rng.standard_normal((500, 64)).astype(np.float32))
    host.save(tmp_path / "a.npz")
    dev = KeyPool.load(tmp_path / "a.npz", device="cuda")
    assert dev._last_write is not None  # the copies' event: the next write waits for it
    side = side_stream()
    more = rng.standard_normal((300, 64)).astype(np.float32) * 50  # rescales a's last block
    host.append("a", more)
    host.append("b", more[:40])
    dev.append("a", more, stream=side)
    dev.append("b", more[:40], stream=side)
    dev.save(tmp_path / "b.npz")  # no synchronize here: save waits for the side stream's writes
    host.save(tmp_path / "h.npz")
    saved, want = KeyPool.load(tmp_path / "b.npz"), KeyPool.load(tmp_path / "h.npz")
    for name in ("keys_fp4", "key_scale", "key_gscale"):
        np.testing.assert_array_equal(getattr(saved, name), getattr(want, name))


def _assert_same_pool(host, dev):
    for name in ("keys_fp4", "key_scale", "key_gscale"):
        np.testing.assert_array_equal(getattr(host, name).view(np.uint8), getattr(dev, name).get().view(np.uint8),
                                      err_msg=name)
    assert host.sequences == dev.sequences and host._free == dev._free


@pytest.mark.parametrize("D, E", [(32, 1), (64, 16), (128, 64), (256, 8), (128, 2048)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_device_append_many_writes_the_host_pools_bytes(D, E, dtype):
    """One kernel launch a step (kernels/key_write.cu) writes exactly the bytes the host pool's
    appends write, over adversarial keys: blocks that grow (some groups re-quantized), zero and
    -0.0 rows, rows at exactly a capacity, counts of 0 and off block edges; float16 keys as
    their float32 values."""
    cp = arrays.cupy()
    rng = np.random.default_rng(D * E + (dtype == np.float16))
    blocks = 400 if E < 2048 else 12
    host = KeyPool(blocks, entries_per_block=E, head_dim=D)
    dev = KeyPool(blocks, entries_per_block=E, head_dim=D, device="cuda")
    launches = []
    original = KeyPool._write_blocks

    def count(self, items, k):
        launches.append(len(items))
        return original(self, items, k)

    KeyPool._write_blocks = count
    try:
        for chosen, keys, counts in append_steps(rng, D, min(E, 64), [0, "b", 2, "d", 4], 10):
            if dtype == np.float16:  # within float16's range
                keys = np.clip(keys / 1024, -6e4, 6e4)
            keys = keys.astype(dtype)
            assert host.append_many(chosen, keys, counts).tolist() == dev.append_many(chosen, cp.asarray(keys),
                                                                                       counts).tolist()
        # and through append, into the last blocks
        more = rng.standard_normal((E + 3, D)).astype(dtype) * dtype(1000)
        assert host.append("b", more) == dev.append("b", cp.asarray(more))
    finally:
        KeyPool._write_blocks = original
    _assert_same_pool(host, dev)
    assert len(launches) == 11  # one write a call


def test_device_append_many_is_all_or_nothing_when_the_pool_is_full():
    cp = arrays.cupy()
    rng = np.random.default_rng(41)
    host = KeyPool(4, entries_per_block=4, head_dim=32)
    dev = KeyPool(4, entries_per_block=4, head_dim=32, device="cuda")
    first = rng.standard_normal((3, 32)).astype(np.float32)
    host.append("a", first)
    dev.append("a", cp.asarray(first))
    keys = cp.asarray(rng.standard_normal((14, 32)).astype(np.float32) * 100)
    with pytest.raises(PoolFullError, match="need 4 free blocks"):
        dev.append_many(["a", "b", "c"], keys, [1, 4, 9])
    _assert_same_pool(host, dev)
    with pytest.raises(ValueError, match="NaN or Inf"):
        dev.append_many(["a", "b"], cp.asarray(np.full((2, 32), np.nan, np.float32)))
    _assert_same_pool(host, dev)


def test_device_pool_scores_what_append_many_wrote():
    """A decode step's loop: append one key to each sequence, score every sequence's pool."""
    cp = arrays.cupy()
    rng = np.random.default_rng(42)
    dev = KeyPool(64, entries_per_block=16, head_dim=128, device="cuda")
    host = KeyPool(64, entries_per_block=16, head_dim=128)
    seqs = [0, 1, 2, 3]
    prompt = rng.standard_normal((60, 128)).astype(np.float32)
    host.append_many(seqs, prompt, [10, 20, 0, 30])
    dev.append_many(seqs, cp.asarray(prompt), [10, 20, 0, 30])
    q = rng.standard_normal((4, 64, 128)).astype(np.float32)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    for _ in range(5):
        step = rng.standard_normal((4, 128)).astype(np.float32)
        host.append_many(seqs, step)
        dev.append_many(seqs, cp.asarray(step))
        got = dev.score_topk(cp.asarray(q), cp.asarray(w), seqs, 16)
        problem = testing.Problem(q, w, host.keys_fp4, host.key_scale, host.key_gscale,
                                  host.block_table(seqs), host.lengths(seqs), 16)
        testing.check_topk(problem, got.get(), tol=testing.TOL_FAST)
    _assert_same_pool(host, dev)


def test_device_append_many_unvalidated_writes_the_same_and_stays_in_its_blocks():
    """validate=False skips the keys' read-back: finite keys give the validated call's bytes;
    NaN and Inf keys are written as garbage into the call's own blocks only."""
    cp = arrays.cupy()
    rng = np.random.default_rng(43)
    checked = KeyPool(64, entries_per_block=8, head_dim=64, device="cuda")
    unchecked = KeyPool(64, entries_per_block=8, head_dim=64, device="cuda")
    for chosen, keys, counts in append_steps(rng, 64, 8, [0, 1, 2], 6):
        keys = cp.asarray(keys)
        assert (checked.append_many(chosen, keys, counts).tolist()
                == unchecked.append_many(chosen, keys, counts, validate=False).tolist())
    for name in ("keys_fp4", "key_scale", "key_gscale"):
        np.testing.assert_array_equal(getattr(checked, name).get(), getattr(unchecked, name).get())
    before = {name: getattr(unchecked, name).get() for name in ("keys_fp4", "key_scale", "key_gscale")}
    bad = rng.standard_normal((20, 64)).astype(np.float32)
    bad[3, 5], bad[12, 0], bad[17, 9] = np.nan, np.inf, -np.inf
    unchecked.append_many([1, "new"], cp.asarray(bad), [4, 16], validate=False)
    cp.cuda.Device().synchronize()
    touched = set(unchecked._blocks["new"]) | set(unchecked._blocks[1][-2:])
    for name, was in before.items():
        now = getattr(unchecked, name).get()
        untouched = [b for b in range(64) if b not in touched]
        np.testing.assert_array_equal(now[untouched], was[untouched], err_msg=name)


def test_device_pool_takes_bfloat16_keys_as_their_float32_values():
    """bfloat16 keys (a PyTorch CUDA tensor, or NumPy's through ml_dtypes) widened on the
    device from their bits: the bytes of the same keys given as float32."""
    import ml_dtypes

    rng = np.random.default_rng(44)
    x = (rng.standard_normal((40, 64)) * 5).astype(ml_dtypes.bfloat16)
    want = KeyPool(8, entries_per_block=16, head_dim=64)
    want.append("s", x[:25].astype(np.float32))
    want.append_many(["s", "t"], x[25:].astype(np.float32), [5, 10])
    dev = KeyPool(8, entries_per_block=16, head_dim=64, device="cuda")
    dev.append("s", x[:25])
    dev.append_many(["s", "t"], x[25:], [5, 10])
    _assert_same_pool(want, dev)
    torch = pytest.importorskip("torch")
    tdev = KeyPool(8, entries_per_block=16, head_dim=64, device="cuda")
    t = torch.from_numpy(x.astype(np.float32)).to("cuda", torch.bfloat16)
    tdev.append("s", t[:25])
    tdev.append_many(["s", "t"], t[25:], [5, 10])
    torch.cuda.synchronize()
    _assert_same_pool(want, tdev)


def test_device_keys_check_refuses_what_the_host_pools_refuses():
    """A GPU pool's keys check (kernels/key_write.cu's key_check_kernel, one read-back): one
    element anywhere of NaN, +-Inf, a float64 that overflows float32, or just past MAX_KEY
    is refused with the host pool's message and nothing written; MAX_KEY itself is stored."""
    from indexer.keywrite import MAX_KEY
    cp = arrays.cupy()
    rng = np.random.default_rng(43)
    host = KeyPool(64, entries_per_block=16, head_dim=64)
    dev = KeyPool(64, entries_per_block=16, head_dim=64, device="cuda")
    above = float(np.nextafter(np.float32(MAX_KEY), np.float32(np.inf)))
    for trial, value in enumerate([np.nan, np.inf, -np.inf, 1e300, above, -above, MAX_KEY, -MAX_KEY] * 2):
        n = int(rng.integers(1, 40))
        keys = rng.standard_normal((n, 64))
        keys[rng.integers(0, n), rng.integers(0, 64)] = value
        seqs = [f"s{trial}", f"t{trial}"]
        counts = [int(c) for c in (rng.integers(0, n + 1),)]
        counts.append(n - counts[0])
        outcomes = []
        for pool, xp in ((host, np), (dev, cp)):
            try:
                pool.append_many(seqs, xp.asarray(keys), counts)
                outcomes.append(None)
            except ValueError as e:
                outcomes.append(str(e))
        assert outcomes[0] == outcomes[1], (trial, value)
        assert (outcomes[0] is None) == (abs(value) == MAX_KEY), (trial, value)
        _assert_same_pool(host, dev)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pytorch_keys_written_late_on_its_stream_are_the_ones_appended(dtype):
    """Keys a PyTorch kernel writes after ~0.1 s of GPU sleep on PyTorch's current stream, a
    side stream (not the legacy default stream, which every blocking stream waits for): the
    pool (no stream given: PyTorch's) reads them by pointer on that stream, after the write,
    not the zeros before it."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(44)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    host = KeyPool(4, entries_per_block=16, head_dim=64)
    dev = KeyPool(4, entries_per_block=16, head_dim=64, device="cuda")
    keys = torch.zeros((5, 64), device="cuda", dtype=getattr(torch, dtype))
    source = torch.from_numpy(x).cuda().to(keys.dtype)
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(200_000_000)
        keys.copy_(source)
        dev.append_many(["a"], keys, [5])
    host.append_many(["a"], source.float().cpu().numpy(), [5])
    torch.cuda.synchronize()
    _assert_same_pool(host, dev)
