"""The selects' block sort on its own, against NumPy: every size class (one warp, register
and shuffle stages, shared-memory stages, past the register capacity), duplicates, keys
with equal high halves (equal scores: the index half decides), zero padding."""

import numpy as np
import pytest

from indexer import arrays
from tests.gpu import requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


def sort_size(n):
    size = 256
    while size < n:
        size *= 2
    return size


@pytest.mark.parametrize("threads", [1024, 256, 128])  # 128: the short-row select (512 keys: its rolled form)
@pytest.mark.parametrize("n", [1, 5, 255, 256, 257, 500, 512, 1000, 2048, 2049, 4096, 8192])
@pytest.mark.parametrize("kind", ["random", "plateaus"])
def test_block_sort_matches_numpy(threads, n, kind):
    from indexer import _jit

    cp = arrays.cupy()
    size = sort_size(n)
    if threads == 256 and size > 4096:
        pytest.skip("the row kernel sorts at most 4,096 keys")
    if threads == 128 and size > 1024:
        pytest.skip("the short-row kernel sorts at most 1,024 keys")
    rng = np.random.default_rng(n * 7 + threads + len(kind))
    if kind == "random":
        keys = rng.integers(1, 2**64 - 1, size=n, dtype=np.uint64)
    else:  # a few distinct scores, each with many indices: (key << 32) | ~index
        score = rng.integers(1, 4, size=n, dtype=np.uint64) << np.uint64(62)
        index = rng.permutation(n).astype(np.uint64)
        keys = score | (np.uint64(0xFFFFFFFF) - index)
        keys[rng.random(n) < 0.1] = keys[0]  # exact duplicates too
    kernel = _jit.get_kernel("select_fast.cu", f"block_sort_kernel<{threads}>")
    kernel.max_dynamic_shared_size_bytes = max(kernel.max_dynamic_shared_size_bytes, 8 * size)
    out = cp.full(size, 7, dtype=cp.uint64)
    kernel((1,), (threads,), (cp.asarray(keys), np.int32(n), out), shared_mem=8 * size)
    want = np.sort(np.concatenate([keys, np.zeros(size - n, dtype=np.uint64)]))[::-1]
    np.testing.assert_array_equal(out.get(), want)
