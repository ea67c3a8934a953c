"""Several GPUs: inputs on GPU 1 are scored on GPU 1 (results there, equal to GPU 0's, no
memory taken on GPU 0), and concurrent calls from threads, each on its own stream and
device, all meet the reference's contract."""

import numpy as np
import pytest

import indexer
from indexer import arrays, testing
from tests.gpu import check_threads, requires_gpu


def _device_count():
    cp = arrays.cupy()
    return 0 if cp is None else cp.cuda.runtime.getDeviceCount()


pytestmark = [requires_gpu, pytest.mark.gpu,
              pytest.mark.skipif(_device_count() < 2, reason="needs at least two CUDA GPUs")]


def on(device, p):
    cp = arrays.cupy()
    with cp.cuda.Device(device):
        return [cp.asarray(a) for a in p.arrays()]


def device0_memory():
    """(bytes CuPy's pool holds on GPU 0, free bytes on GPU 0 as the driver sees them)."""
    cp = arrays.cupy()
    with cp.cuda.Device(0):
        cp.cuda.Device(0).synchronize()
        return cp.get_default_memory_pool().total_bytes(), cp.cuda.runtime.memGetInfo()[0]


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_inputs_on_gpu1_give_results_on_gpu1_equal_to_gpu0(precision):
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(70), T=4, H=64, D=128, E=64, lens=4000, top_k=256)
    d0, d1 = on(0, p), on(1, p)
    assert cp.cuda.runtime.getDevice() == 0
    r0 = indexer.score_topk(*d0, p.top_k, precision=precision, return_scores=True)
    ws = indexer.Workspace()
    kw = dict(precision=precision, return_scores=True)
    indexer.score_topk(*d1, p.top_k, workspace=ws, **kw)  # warm-up: kernels for GPU 1, workspace on GPU 1
    before = device0_memory()
    r1 = indexer.score_topk(*d1, p.top_k, **kw)  # called with GPU 0 current
    with cp.cuda.Device(1):
        out = (cp.empty((4, 256), dtype=cp.int32), cp.empty((4, 256), dtype=cp.float32))
    indexer.score_topk(*d1, p.top_k, workspace=ws, out=out, **kw)
    assert device0_memory() == before  # nothing allocated on GPU 0
    assert cp.cuda.runtime.getDevice() == 0  # the current device is left as it was
    assert r1[0].device.id == 1 and r1[1].device.id == 1
    assert "devices=[1]" in repr(ws)
    for got in (r1, out):
        np.testing.assert_array_equal(got[0].get(), r0[0].get())
        assert got[1].get().tobytes() == r0[1].get().tobytes()
    testing.check_topk(p, r1[0].get(), r1[1].get(), tol=testing.TOL_EXACT if precision == "exact" else testing.TOL_FAST)


def test_ragged_and_key_pool_on_gpu1():
    cp = arrays.cupy()
    rng = np.random.default_rng(71)
    pool = indexer.KeyPool(32, entries_per_block=16, head_dim=64, device="cuda:1")
    host = indexer.KeyPool(32, entries_per_block=16, head_dim=64)
    for seq, n in (("a", 100), ("b", 37)):
        keys = rng.standard_normal((n, 64)).astype(np.float32)
        pool.append(seq, keys)
        host.append(seq, keys)
    q = rng.standard_normal((5, 8, 64)).astype(np.float32)
    w = rng.standard_normal((5, 8)).astype(np.float32)
    cu = np.array([0, 2, 5], dtype=np.int32)
    lens = np.array([10, 100, 3, 20, 37], dtype=np.int32)
    with cp.cuda.Device(1):
        qd, wd, cud, lensd = (cp.asarray(a) for a in (q, w, cu, lens))
    ws = indexer.Workspace()
    got = pool.score_topk(qd, wd, ["a", "b"], 16, cu_seqlens_q=cud, valid_lens=lensd, workspace=ws,
                          return_scores=True)
    assert got[0].device.id == 1 and cp.cuda.runtime.getDevice() == 0
    assert "devices=[1]" in repr(ws)
    # the host pool holds bit-identical arrays: check against the reference's contract
    per_token = host.block_table(["a", "b"])[np.array([0, 0, 1, 1, 1])]
    problem = testing.Problem(q, w, host.keys_fp4, host.key_scale, host.key_gscale, per_token, lens, 16)
    testing.check_topk(problem, got[0].get(), got[1].get(), tol=testing.TOL_FAST)


def test_key_pool_refuses_keys_on_another_gpu_by_name():
    """A pool on cuda:1 given keys on cuda:0: a ValueError naming keys (its check and write
    kernels would read them through a pointer of the wrong device), nothing written."""
    cp = arrays.cupy()
    pool = indexer.KeyPool(8, entries_per_block=16, head_dim=64, device="cuda:1")
    pool.append("a", np.ones((3, 64), np.float32))
    before = [a.get() for a in (pool.keys_fp4, pool.key_scale, pool.key_gscale)]
    with cp.cuda.Device(0):
        keys = cp.ones((2, 64), cp.float32)
    for call in (lambda: pool.append("a", keys), lambda: pool.append_many(["a", "b"], keys),
                 lambda: pool.append_many(["a", "b"], keys, validate=False)):
        with pytest.raises(ValueError, match=r"^keys: expected an array on cuda:1 \(the pool's\)"):
            call()
    assert pool.length("a") == 3 and pool.length("b") == 0
    for a, b in zip((pool.keys_fp4, pool.key_scale, pool.key_gscale), before):
        np.testing.assert_array_equal(a.get(), b)


def test_concurrent_calls_from_four_threads_on_two_gpus():
    problems = [[testing.random_problem(np.random.default_rng(200 + 10 * i + j), T=4, H=32, D=128, E=64,
                                        lens=None, L=30, top_k=128) for j in range(3)] for i in range(4)]

    check_threads(problems, lambda i: i % 2)
