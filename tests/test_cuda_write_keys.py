"""indexer.write_keys on device arrays (kernels/key_write.cu's slots kernel): the host form's
bytes, from CuPy and PyTorch, captured in a CUDA graph, and bad input refused by name with
nothing written (or, unchecked, written only inside the pool's arrays)."""

import numpy as np
import pytest

import indexer
from indexer import arrays
from tests.gpu import requires_gpu, side_stream
from tests.pool_steps import adversarial_keys, empty_pool, new_slots, padded_call, write_keys_steps

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
    stream = side_stream()
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


def on_device(framework, a, dtype=None):
    """NumPy array ``a`` as a CuPy array or a PyTorch CUDA tensor (of PyTorch dtype ``dtype``)."""
    if framework == "cupy":
        return arrays.cupy().asarray(a)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(np.ascontiguousarray(a)).cuda()
    return t if dtype is None else t.to(getattr(torch, dtype))


@pytest.mark.parametrize("framework, key_dtype", [("cupy", None), ("torch", None), ("torch", "bfloat16")])
@pytest.mark.parametrize("keys, slots, match", bad_values())
def test_bad_values_refused_with_the_host_forms_message_and_nothing_written(keys, slots, match, framework,
                                                                            key_dtype):
    """From CuPy arrays and from PyTorch tensors (read by address on PyTorch's stream; float32
    and bfloat16 keys, whose values here are bfloat16's too): the host form's message, worded
    from the caller's arrays, and the pool as it was."""
    rng = np.random.default_rng(53)
    host = empty_pool(4, 16, 32, np)
    indexer.write_keys(rng.standard_normal((20, 32)).astype(np.float32), np.arange(20), *host)
    host[2][3] = 0.75
    dev = [on_device(framework, a) for a in host]
    with pytest.raises(ValueError, match=match):
        indexer.write_keys(on_device(framework, keys, key_dtype), on_device(framework, slots), *dev)
    assert_pool(dev, host)


@pytest.mark.parametrize("framework", ["cupy", "torch"])
def test_bad_arguments_refused_by_name_from_each_framework(framework):
    """The arguments' checks on device arrays: dtypes, shapes, layouts, each named."""
    rng = np.random.default_rng(58)
    host = empty_pool(4, 16, 32, np)
    dev = [on_device(framework, a) for a in host]
    keys = on_device(framework, rng.standard_normal((3, 32)).astype(np.float32))
    slots = on_device(framework, np.array([16, 17, 18]))
    wide = on_device(framework, rng.standard_normal((32, 3)).astype(np.float32))
    cases = [
        ((wide.T, slots, *dev), ValueError, "keys: expected a C-contiguous array"),
        ((keys, slots[::1].reshape(3, 1), *dev), ValueError, r"slots: expected shape \(3,\)"),
        ((keys, slots.astype("int16") if framework == "cupy" else slots.short(), *dev), TypeError,
         "slots: expected dtype int32 or int64"),
        ((keys, slots, dev[0][:, ::2], *dev[1:]), ValueError, r"keys_fp4: expected a C-contiguous array"),
        ((keys, slots, dev[0], dev[1][:3], dev[2]), ValueError, "key_scale: expected shape"),
        ((keys, slots, dev[1], dev[1], dev[2]), ValueError, r"keys_fp4: expected shape \(P, E, D/2\)"),
        ((keys[:, :16], slots, *dev), ValueError, r"keys: expected shape \(N, 32\)"),
    ]
    for args, error, match in cases:
        with pytest.raises(error, match=match):
            indexer.write_keys(*args)
    assert_pool(dev, host)


@pytest.mark.parametrize("framework", ["cupy", "torch"])
def test_misaligned_keys_refused_and_empty_or_single_keys_taken(framework):
    """Keys 2 bytes off their float32 alignment (a view cut inside a buffer) refused by name
    from CuPy and from PyTorch (read by address); no keys write nothing; one key of shape
    (D,) is one key."""
    cp = arrays.cupy()
    rng = np.random.default_rng(60)
    host = empty_pool(4, 16, 32, np)
    dev = [on_device(framework, a) for a in host]
    buf = cp.zeros(3 * 32 + 1, cp.float32)
    odd = cp.ndarray((3, 32), cp.float32, buf.data + 2)
    if framework == "torch":
        torch = pytest.importorskip("torch")
        odd = torch.from_dlpack(odd)
    with pytest.raises(ValueError, match="keys: expected a device array aligned to its 4-byte elements"):
        indexer.write_keys(odd, on_device(framework, np.array([16, 17, 18])), *dev)
    empty = on_device(framework, np.zeros((0, 32), np.float32))
    assert indexer.write_keys(empty, on_device(framework, np.zeros(0, np.int64)), *dev) is None
    assert_pool(dev, host)
    one = rng.standard_normal(32).astype(np.float32)
    indexer.write_keys(on_device(framework, one), on_device(framework, np.array([40])), *dev)
    indexer.write_keys(one, np.array([40]), *host)
    assert_pool(dev, host)


def test_pytorch_keys_that_require_grad_are_written():
    """Keys of a model's graph (requires_grad) are read as their values, as NumPy's would be."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(59)
    x = rng.standard_normal((5, 32)).astype(np.float32)
    host = empty_pool(4, 16, 32, np)
    indexer.write_keys(x, np.arange(5) + 20, *host)
    dev = [on_device("torch", a) for a in empty_pool(4, 16, 32, np)]
    keys = torch.from_numpy(x).cuda().requires_grad_()
    indexer.write_keys(keys * 1.0, torch.arange(5, device="cuda") + 20, *dev)
    torch.cuda.synchronize()
    assert_pool(dev, host)


def test_unvalidated_bad_values_stay_inside_the_pool():
    """validate=False: an out-of-range slot is skipped, NaN / Inf keys and a block written by
    two runs give garbage in the blocks written only (run under memcheck by the device
    round)."""
    cp = arrays.cupy()
    rng = np.random.default_rng(54)
    dev = empty_pool(8, 16, 32, cp)
    indexer.write_keys(cp.asarray(rng.standard_normal((40, 32)).astype(np.float32)), cp.arange(40), *dev)
    before = [a.get() for a in dev]
    keys = rng.standard_normal((8, 32)).astype(np.float32)
    keys[0, 0], keys[3, 1] = np.nan, np.inf
    # block 4 twice; four out of range; slot 0 after the largest int64 (no overflow joins them)
    slots = np.array([-5, 64, 65, 67, 10**9, 2**31 - 1, 2**63 - 1, 0], np.int64)
    indexer.write_keys(cp.asarray(keys), cp.asarray(slots), *dev, validate=False)
    cp.cuda.Device().synchronize()
    block0 = [a.copy() for a in before]
    indexer.write_keys(keys[7:], slots[7:], *block0)  # the host form of the one good run
    for a, b, c in zip(dev, before, block0):
        now = a.get()
        np.testing.assert_array_equal(np.delete(now, [0, 4], axis=0), np.delete(b, [0, 4], axis=0))
        np.testing.assert_array_equal(now[0], c[0])


def random_call(rng, P, E, D):
    """A write_keys call that may be bad in any of the device check's ways: keys, int64
    slots and the pool's global scales. Runs of 1..E keys into blocks drawn with steps of a
    power of two (blocks the check's hash places on one probe chain), sometimes one block
    twice, a slot out of range, a key of NaN, Inf or just above MAX_KEY, or a written block's
    scale not a power of two or out of range; sometimes padding keys (slot -1, NaN values)
    between runs and at the end."""
    from indexer.keywrite import MAX_KEY
    n_runs = int(rng.integers(1, 400))
    step = 2 ** int(rng.integers(0, 8))
    blocks = (rng.permutation(P // step)[:n_runs] * step).astype(np.int64)
    n_runs = blocks.shape[0]
    if rng.random() < 0.3 and n_runs > 1:
        blocks[rng.integers(1, n_runs)] = blocks[rng.integers(0, n_runs)]  # maybe one block twice
    firsts = rng.integers(0, E, n_runs)
    lengths = [int(rng.integers(1, E - f + 1)) for f in firsts]
    slots = np.concatenate([b * E + f + np.arange(n) for b, f, n in zip(blocks, firsts, lengths)])
    keys = adversarial_keys(rng, slots.shape[0], D)
    if rng.random() < 0.5:  # padding keys (slot -1, garbage values) between runs and at the end
        at = np.sort(rng.choice(np.cumsum(lengths), int(rng.integers(1, 20))))
        slots = np.insert(slots, at, -1)
        keys = np.insert(keys, at, np.float32(np.nan), axis=0)
    g = np.exp2(rng.integers(-20, 21, P)).astype(np.float32)
    kind = rng.integers(0, 8)
    i = int(rng.integers(0, slots.shape[0]))
    if kind == 0:
        slots[i] = rng.choice([-2, P * E, -(2**40), 2**40])
    elif kind == 1:
        keys[i, int(rng.integers(0, D))] = rng.choice([np.nan, np.inf, -np.inf, np.nextafter(np.float32(MAX_KEY), np.inf)])
    elif kind == 2:
        keys[i, int(rng.integers(0, D))] = -MAX_KEY  # the largest storable: refused by neither
    elif kind == 3:
        g[slots[i] // E] = rng.choice([0.75, 0.0, np.inf, np.nan, -1.0, 2.0**117, 2.0**-127])
    return keys, slots, g


def test_the_device_check_finds_exactly_what_the_host_check_finds():
    """validate=True on device (kernels/key_write.cu's key_check_kernel, one read-back) against
    the host form on copies of the same pool: the same error, or the same bytes written. Up to
    ~6,000 keys a call; blocks spaced by powers of two make long probe chains in its set."""
    cp = arrays.cupy()
    rng = np.random.default_rng(55)
    P, E, D = 4096, 16, 32
    outcomes = set()
    for trial in range(60):
        keys, slots, g = random_call(rng, P, E, D)
        host = empty_pool(P, E, D, np)
        host[2][:] = g
        dev = tuple(cp.asarray(a) for a in host)
        try:
            indexer.write_keys(keys, slots, *host)
            expected = None
        except ValueError as e:
            expected = str(e)
        slot_dtype = np.int32 if trial % 2 and np.abs(slots).max() < 2**31 else np.int64
        try:
            indexer.write_keys(cp.asarray(keys), cp.asarray(slots.astype(slot_dtype)), *dev)
            got = None
        except ValueError as e:
            got = str(e)
        assert got == expected, trial
        assert_pool(dev, host)
        outcomes.add(None if expected is None else " ".join(expected.split(" ")[:2]))
    # passes and each kind of refusal were drawn
    assert outcomes == {None, "slots: slot", "slots: block", "keys: NaN", "keys: magnitudes", "key_gscale: block"}


def test_padding_keys_are_neither_written_nor_checked_on_the_device():
    """Slot -1 (padding, NaN / Inf / huge values) on the device, checked and not, from int32
    and int64 slots: the bytes of the same call without its padding keys (the host form's)."""
    cp = arrays.cupy()
    rng = np.random.default_rng(56)
    for trial in range(12):
        keys, slots, kept_keys, kept_slots = padded_call(rng, 64, 16, 24)
        host = empty_pool(24, 16, 64, np)
        indexer.write_keys(kept_keys, kept_slots, *host)
        dev = empty_pool(24, 16, 64, cp)
        indexer.write_keys(cp.asarray(keys), cp.asarray(slots.astype(np.int32 if trial % 2 else np.int64)), *dev,
                           validate=trial % 3 != 0)
        assert_pool(dev, host)


def test_pytorch_keys_and_slots_written_late_on_its_stream_are_the_ones_written():
    """Keys and slots PyTorch writes after ~0.1 s of GPU sleep on its current stream (a side
    stream, not the legacy default one every blocking stream waits for), read by pointer on
    that stream (write_keys' default there): the new values, not the old."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(57)
    x = rng.standard_normal((6, 32)).astype(np.float32)
    slots = np.arange(6, dtype=np.int64) + 16
    dev = tuple(torch.from_numpy(a).cuda() for a in empty_pool(4, 16, 32, np))
    keys, t_slots = torch.zeros((6, 32), device="cuda"), torch.full((6,), -1, dtype=torch.int64, device="cuda")
    new_keys, new_slots = torch.from_numpy(x).cuda(), torch.from_numpy(slots).cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(200_000_000)
        keys.copy_(new_keys)
        t_slots.copy_(new_slots)
        indexer.write_keys(keys, t_slots, *dev, validate=False)
    host = empty_pool(4, 16, 32, np)
    indexer.write_keys(x, slots, *host)
    torch.cuda.synchronize()
    assert_pool(dev, host)
