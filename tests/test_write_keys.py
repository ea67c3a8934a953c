"""indexer.write_keys on NumPy arrays (the host form): keys addressed by physical slot give the
bytes KeyPool's appends give, and bad input is refused by name with nothing written."""

import ml_dtypes
import numpy as np
import pytest

import indexer
from tests.pool_steps import empty_pool, padded_call, write_keys_steps


@pytest.mark.parametrize("D, E", [(32, 1), (64, 16), (128, 64), (256, 8)])
def test_write_keys_gives_the_pools_bytes(D, E):
    rng = np.random.default_rng(D * 3 + E)
    pool, writes = write_keys_steps(rng, D, E, [0, "b", 2, "d"], 10)
    arrays = empty_pool(pool.num_blocks, E, D)
    for keys, slots in writes:
        indexer.write_keys(keys, slots.astype(np.int32) if E % 2 else slots, *arrays)
    for got, want in zip(arrays, (pool.keys_fp4, pool.key_scale, pool.key_gscale)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_one_key_a_call_as_a_row_and_narrow_dtypes(dtype):
    """A decode loop: one key a sequence a step, each written alone as a (D,) row, float16 and
    bfloat16 as their float32 values: the bytes of KeyPool.append called key by key."""
    from tests.pool_steps import adversarial_keys

    rng = np.random.default_rng(5)
    pool = indexer.KeyPool(40, entries_per_block=8, head_dim=64)
    got = empty_pool(40, 8, 64)
    for _ in range(30):
        keys = np.clip(adversarial_keys(rng, 3, 64) / 1024, -6e4, 6e4).astype(dtype)
        for seq in range(3):
            n = pool.length(seq)
            pool.append(seq, keys[seq].astype(np.float32))
            block = pool._blocks[seq][n // 8]
            indexer.write_keys(keys[seq], np.array([block * 8 + n % 8], np.int32), *got)
    for a, b in zip(got, (pool.keys_fp4, pool.key_scale, pool.key_gscale)):
        np.testing.assert_array_equal(a, b)
    indexer.write_keys(np.zeros((0, 64), np.float32), np.zeros(0, np.int64), *got)  # no keys: nothing written
    np.testing.assert_array_equal(got[0], pool.keys_fp4)


def bad_cases():
    k, s = np.ones((3, 32), np.float32), np.array([32, 33, 34], np.int64)
    nan = k.copy()
    nan[1, 4] = np.nan
    big = k.copy()
    big[2, 0] = 3e38
    return [
        (dict(slots=np.array([32, 33, 64])), ValueError, r"slots: slot 64 of key 2 is outside \[0, 64\)"),
        (dict(slots=np.array([-2, 0, 1])), ValueError, "slots: slot -2 of key 0 .* -1 marks a padding key"),
        (dict(slots=np.array([32, 33, 35])), ValueError, "slots: block 2 is written by two runs of keys"),
        (dict(slots=np.array([34, 32, 33])), ValueError, "slots: block 2 is written by two runs"),
        (dict(keys=nan), ValueError, "keys: NaN or Inf cannot be encoded"),
        (dict(keys=big), ValueError, "keys: magnitudes above"),
        (dict(gscale=np.float32(0.75)), ValueError, "key_gscale: block 2's global scale 0.75 is not a power of two"),
        (dict(slots=s.astype(np.uint32)), TypeError, "slots: expected dtype int32 or int64"),
        (dict(slots=s[:2]), ValueError, r"slots: expected shape \(3,\)"),
        (dict(slots=[16, 17, 18]), TypeError, "slots: expected an int32 or int64 array"),
        (dict(keys=k.astype(np.float64)), TypeError, "keys: expected dtype float32, float16 or bfloat16"),
        (dict(keys=np.ones((3, 64), np.float32)), ValueError, r"keys: expected shape \(N, 32\)"),
        (dict(codes_dtype=np.int8), TypeError, "keys_fp4: expected dtype uint8"),
        (dict(scale_shape=(4, 16, 3)), ValueError, r"key_scale: expected shape \(4, 16, 2\)"),
        (dict(gscale_shape=5), ValueError, r"key_gscale: expected shape \(4,\)"),
        (dict(mixed=True), TypeError, "expected all NumPy arrays or all device arrays"),
        (dict(stream="s"), TypeError, "stream"),
    ]


@pytest.mark.parametrize("case, exc, match", bad_cases())
def test_bad_input_is_refused_by_name_and_nothing_is_written(case, exc, match):
    rng = np.random.default_rng(6)
    codes, scales, g = empty_pool(4, 16, 32)
    indexer.write_keys(rng.standard_normal((20, 32)).astype(np.float32), np.arange(20, dtype=np.int64), codes, scales, g)
    if "gscale" in case:
        g[2] = case["gscale"]
    if "codes_dtype" in case:
        codes = codes.astype(case["codes_dtype"])
    if "scale_shape" in case:
        scales = np.zeros(case["scale_shape"], np.uint8)
    if "gscale_shape" in case:
        g = np.ones(case["gscale_shape"], np.float32)
    before = [a.copy() for a in (codes, scales, g)]
    keys = case.get("keys", np.ones((3, 32), np.float32))
    slots = case.get("slots", np.array([32, 33, 34], np.int64))
    pool = [codes, scales, g]
    if case.get("mixed"):
        pool[2] = memoryview(g)
    with pytest.raises(exc, match=match):
        indexer.write_keys(keys, slots, *pool, stream=case.get("stream"))
    for a, b in zip((codes, scales, g), before):
        np.testing.assert_array_equal(a, b)


def test_a_run_at_entry_zero_starts_its_block_afresh():
    """A block written from entry 0 again is a fresh block: its old entries are zeroed and
    its scale comes from the new keys alone."""
    rng = np.random.default_rng(7)
    codes, scales, g = empty_pool(2, 8, 32)
    indexer.write_keys((rng.standard_normal((8, 32)) * 1000).astype(np.float32), np.arange(8), codes, scales, g)
    indexer.write_keys(rng.standard_normal((2, 32)).astype(np.float32), np.arange(2), codes, scales, g)
    assert not codes[0, 2:].any() and not scales[0, 2:].any()
    assert g[0] <= 2.0**-9  # a scale for values ~1, not ~1000


def test_padding_keys_are_neither_written_nor_checked():
    """A slot of -1 marks a padding key (an engine's batch padded to a captured size): the
    call writes what the same call without its padding keys writes, whatever their values."""
    rng = np.random.default_rng(8)
    for trial in range(20):
        keys, slots, kept_keys, kept_slots = padded_call(rng, 32, 8, 6)
        padded, plain = empty_pool(6, 8, 32), empty_pool(6, 8, 32)
        indexer.write_keys(keys, slots.astype(np.int32) if trial % 2 else slots, *padded)
        indexer.write_keys(kept_keys, kept_slots, *plain)
        for a, b in zip(padded, plain):
            np.testing.assert_array_equal(a, b)
    only_padding = empty_pool(2, 8, 32)
    indexer.write_keys(np.full((3, 32), np.nan, np.float32), np.full(3, -1), *only_padding)
    for a, b in zip(only_padding, empty_pool(2, 8, 32)):
        np.testing.assert_array_equal(a, b)
