"""indexer.write_keys on device arrays (kernels/key_write.cu's slots kernel): the host form's
bytes, from CuPy and PyTorch, captured in a CUDA graph, and bad input refused by name with
nothing written (or, unchecked, written only inside the pool's arrays)."""

import numpy as np
import pytest

import indexer
from indexer import arrays
from tests.gpu import requires_gpu
from tests.pool_steps import adversarial_keys, empty_pool, new_slots, write_keys_steps

pytestmark = [requires_gpu, pytest.mark.gpu]


def assert_pool(dev, host):
    for name, a, b in zip(("keys_fp4", "key_scale", "key_gscale"), dev, host):
        got = a if isinstance(a, np.ndarray) else a.get() if hasattr(a, "get") else a.cpu().numpy()
        np.testing.assert_array_equal(got.view(np.uint8), np.asarray(b).view(np.uint8), err_msg=name)


@pytest.mark.parametrize("D, E", [(32, 1), (64, 16), (128, 64), (256, 8), (128, 2048)])
@pytest.mark.parametrize("slot_dtype, key_dtype", [(np.int64, np.float32), (np.int32, np.float16)])
def test_device_write_keys_gives_the_pools_bytes(D, E, slot_dtype, key_dtype):
    cp = arrays.cupy()
    rng = np.random.default_rng(D + E + (slot_dtype == np.int32))
    if E < 2048:
        pool, writes = write_keys_steps(rng, D, E, [0, "b", 2, "d", 4], 10)
    else:  # a few long runs into big blocks
        pool, writes = indexer.KeyPool(12, entries_per_block=E, head_dim=D), []
        for _ in range(4):
            keys = adversarial_keys(rng, 700, D)
            before = {s: pool.length(s) for s in (0, 1)}
            pool.append_many([0, 1], keys, [300, 400])
            writes.append((keys, new_slots(pool, [0, 1], [300, 400], before)))
    dev = empty_pool(pool.num_blocks, E, D, cp)
    for keys, slots in writes:
        if key_dtype == np.float16:  # a pool of the same keys' float16 values
            keys = np.clip(keys / 1024, -6e4, 6e4).astype(np.float16)
        indexer.write_keys(cp.asarray(keys), cp.asarray(slots.astype(slot_dtype)), *dev)
    host = empty_pool(pool.num_blocks, E, D, np)
    for keys, slots in writes:
        if key_dtype == np.float16:
            keys = np.clip(keys / 1024, -6e4, 6e4).astype(np.float16)
        indexer.write_keys(keys, slots, *host)
    if key_dtype == np.float32:
        assert_pool(host, (pool.keys_fp4, pool.key_scale, pool.key_gscale))  # the host form is the pool's
    assert_pool(dev, host)


def test_pytorch_tensors_and_bfloat16_keys():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(51)
    pool, writes = write_keys_steps(rng, 128, 64, [0, 1, 2], 8)
    dev = tuple(torch.from_numpy(a).cuda() for a in empty_pool(pool.num_blocks, 64, 128, np))
    host = empty_pool(pool.num_blocks, 64, 128, np)
    for keys, slots in writes:
        t = torch.from_numpy(keys).to("cuda", torch.bfloat16)
        indexer.write_keys(t, torch.from_numpy(slots).cuda(), *dev)
        indexer.write_keys(t.float().cpu().numpy(), slots, *host)
    torch.cuda.synchronize()
    assert_pool(dev, host)


def test_a_cuda_graph_holds_the_unvalidated_write():
    """A decode loop: each step's B keys and slots refilled into static buffers, the write
    replayed from a graph captured once: the host form's bytes after every step."""
    cp = arrays.cupy()
    rng = np.random.default_rng(52)
    B, D, E = 8, 128, 16
    pool = indexer.KeyPool(200, entries_per_block=E, head_dim=D)
    host, dev = empty_pool(200, E, D, np), empty_pool(200, E, D, cp)
    keys_buf, slots_buf = cp.zeros((B, D), cp.float32), cp.zeros(B, cp.int64)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        scratch = empty_pool(200, E, D, cp)
        indexer.write_keys(keys_buf, slots_buf, *scratch, validate=False)  # compiles outside the capture
        stream.begin_capture()
        indexer.write_keys(keys_buf, slots_buf, *dev, validate=False)
        graph = stream.end_capture()
    for _ in range(40):
        keys = adversarial_keys(rng, B, D)
        before = {s: pool.length(s) for s in range(B)}
        pool.append_many(list(range(B)), keys)
        slots = new_slots(pool, list(range(B)), [1] * B, before)
        indexer.write_keys(keys, slots, *host)
        keys_buf.set(keys, stream=stream)
        slots_buf.set(slots, stream=stream)
        graph.launch(stream)
    stream.synchronize()
    assert_pool(dev, host)


def bad_values():
    k = np.ones((3, 32), np.float32)
    nan = k.copy()
    nan[1, 4] = np.nan
    return [(k, np.array([32, 33, 64]), "slots: slot 64 of key 2 is outside"),
            (k, np.array([32, 33, 35]), "slots: block 2 is written by two runs of keys"),
            (nan, np.array([32, 33, 34]), "keys: NaN or Inf cannot be encoded"),
            (k, np.array([48, 49, 50]), "key_gscale: block 3's global scale 0.75")]


@pytest.mark.parametrize("keys, slots, match", bad_values())
def test_bad_values_refused_with_the_host_forms_message_and_nothing_written(keys, slots, match):
    cp = arrays.cupy()
    rng = np.random.default_rng(53)
    dev = empty_pool(4, 16, 32, cp)
    indexer.write_keys(cp.asarray(rng.standard_normal((20, 32)).astype(np.float32)), cp.arange(20), *dev)
    dev[2][3] = 0.75
    before = [a.get() for a in dev]
    with pytest.raises(ValueError, match=match):
        indexer.write_keys(cp.asarray(keys), cp.asarray(slots), *dev)
    assert_pool(dev, before)


def test_unvalidated_bad_values_stay_inside_the_pool():
    """validate=False: an out-of-range slot is skipped, NaN / Inf keys and a block written by
    two runs give garbage in the blocks written only (run under memcheck by the device
    round)."""
    cp = arrays.cupy()
    rng = np.random.default_rng(54)
    dev = empty_pool(8, 16, 32, cp)
    indexer.write_keys(cp.asarray(rng.standard_normal((40, 32)).astype(np.float32)), cp.arange(40), *dev)
    before = [a.get() for a in dev]
    keys = rng.standard_normal((6, 32)).astype(np.float32)
    keys[0, 0], keys[3, 1] = np.nan, np.inf
    slots = np.array([-5, 64, 65, 67, 10**9, 2**31 - 1], np.int64)  # block 4 twice; three out of range
    indexer.write_keys(cp.asarray(keys), cp.asarray(slots), *dev, validate=False)
    cp.cuda.Device().synchronize()
    for a, b in zip(dev, before):
        now = a.get()
        np.testing.assert_array_equal(np.delete(now, 4, axis=0), np.delete(b, 4, axis=0))
