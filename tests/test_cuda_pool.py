"""KeyPool on the device holds exactly what the host pool holds, and scores the same."""

import numpy as np
import pytest

from indexer import KeyPool, arrays, testing
from tests.gpu import requires_gpu

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
    for name in ("_write_new", "_write_into", "_zero_blocks"):
        original = getattr(KeyPool, name)

        def spy(self, *args, _original=original, _name=name):
            if self._xp is not np:  # the device pool's writes (the host pool's too call these)
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
    side, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    keys = rng.standard_normal((20, 64)).astype(np.float32)
    host.append("a", keys)
    dev.append("a", keys, stream=side)  # two new blocks
    # the first write waits too: for the pool's zero fill, queued on CuPy's current stream
    assert seen == [("_write_new", side.ptr)] and waits == [(side.ptr, True)]
    more = rng.standard_normal((5, 64)).astype(np.float32)
    host.append("a", more)
    dev.append("a", more, stream=other)  # into the second block, after the first write
    assert seen[-1] == ("_write_into", other.ptr) and waits[-1] == (other.ptr, True)
    torch = pytest.importorskip("torch")
    tside = torch.cuda.Stream()
    last = rng.standard_normal((3, 64)).astype(np.float32)
    host.append("b", last)
    with torch.cuda.stream(tside):
        dev.append("b", torch.from_numpy(last).cuda())
    assert seen[-1] == ("_write_new", tside.cuda_stream) and waits[-1] == (tside.cuda_stream, True)
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
    cp = arrays.cupy()
    rng = np.random.default_rng(23)
    host = KeyPool(64, entries_per_block=16, head_dim=64)
    host.append("a", rng.standard_normal((500, 64)).astype(np.float32))
    host.save(tmp_path / "a.npz")
    dev = KeyPool.load(tmp_path / "a.npz", device="cuda")
    assert dev._last_write is not None  # the copies' event: the next write waits for it
    side = cp.cuda.Stream(non_blocking=True)
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
