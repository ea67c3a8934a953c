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
