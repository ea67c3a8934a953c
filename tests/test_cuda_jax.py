"""JAX device arrays in and out (zero copy through DLPack): the same results as CuPy
inputs; out= takes CuPy arrays (JAX arrays are immutable)."""

import os

import numpy as np
import pytest

import indexer
from indexer import arrays, testing
from tests.gpu import requires_gpu

# JAX grabs most of the GPU's memory on first use unless told otherwise
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")


def _jax_gpu():
    try:
        return jax.devices("gpu")[0]
    except Exception:  # noqa: BLE001  (no CUDA backend in this jaxlib, or no GPU)
        return None


pytestmark = [requires_gpu, pytest.mark.gpu,
              pytest.mark.skipif(not arrays.gpu_supported() or _jax_gpu() is None, reason="needs JAX with a GPU")]


def test_jax_arrays_in_match_cupy_and_the_reference():
    cp = arrays.cupy()
    p = testing.random_problem(np.random.default_rng(60), T=3, H=16, D=64, E=16, L=4, top_k=24)
    x = [jax.device_put(a, _jax_gpu()) for a in p.arrays()]
    idx, sc = indexer.score_topk(*x, p.top_k, return_scores=True)
    assert isinstance(idx, jax.Array) and isinstance(sc, jax.Array)
    assert idx.devices() == {_jax_gpu()} and idx.dtype == np.int32 and sc.dtype == np.float32
    idx, sc = np.asarray(idx), np.asarray(sc)
    testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)
    ref = indexer.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, return_scores=True)
    np.testing.assert_array_equal(idx, ref[0].get())
    assert sc.tobytes() == ref[1].get().tobytes()
    out = (cp.empty((3, 24), dtype=cp.int32), cp.empty((3, 24), dtype=cp.float32))
    assert indexer.score_topk(*x, p.top_k, return_scores=True, out=out, workspace=indexer.Workspace()) is out
    np.testing.assert_array_equal(out[0].get(), ref[0].get())
    assert out[1].get().tobytes() == ref[1].get().tobytes()
    with pytest.raises(TypeError, match="^out: expected a CuPy array"):
        indexer.score_topk(*x, p.top_k, out=np.empty((3, 24), dtype=np.int32))
    with pytest.raises(TypeError, match="^out: expected a CuPy array .JAX arrays are immutable"):
        indexer.score_topk(*x, p.top_k, out=jax.numpy.zeros((3, 24), dtype=jax.numpy.int32))
