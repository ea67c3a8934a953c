"""Both tensor-core scoring kernels (mma.sync and Hopper's wgmma) against the reference,
forced one at a time: the public API picks wgmma where it applies, mma.sync elsewhere."""

import numpy as np
import pytest

from indexer import arrays, geometry, testing
from tests.gpu import requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


def kernels():
    if not arrays.gpu_available():
        return ["mma"]
    from indexer import cuda_ops

    cp = arrays.cupy()
    dev = cuda_ops.device_facts(cp.cuda.Device().id)
    return ["mma", "wgmma"] if geometry.wgmma_supported(64, 128, dev) else ["mma"]


def run(p, kernel, **kw):
    from indexer import cuda_ops

    cp = arrays.cupy()
    idx, sc = cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, precision="fast",
                                  return_scores=True, _fast_kernel=kernel, **kw)
    return idx.get(), sc.get()


@pytest.mark.parametrize("kernel", kernels())
@pytest.mark.parametrize("H,D,E,top_k,T,lens", [
    (64, 128, 64, 512, 3, 5000),
    (64, 128, 16, 100, 4, None),
    (7, 32, 16, 9, 3, None),
    (33, 64, 32, 64, 2, 1000),
    (64, 96, 256, 300, 2, 700),
    (16, 128, 17, 50, 3, 600),   # E not a power of two
])
def test_random(kernel, H, D, E, top_k, T, lens):
    rng = np.random.default_rng(H * 1000 + D + E)
    p = testing.random_problem(rng, T=T, H=H, D=D, E=E, lens=lens, L=None if lens else 5, top_k=top_k)
    idx, sc = run(p, kernel)
    testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)


@pytest.mark.parametrize("kernel", kernels())
@pytest.mark.parametrize("kind", testing.ADVERSARIAL_KINDS)
def test_adversarial(kernel, kind):
    rng = np.random.default_rng(31)
    p = testing.adversarial_problem(kind, rng, H=64, D=128, E=64)
    idx, sc = run(p, kernel)
    testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)


@pytest.mark.parametrize("kernel", kernels())
def test_bit_identical_reruns_and_kernels_agree_on_clear_winners(kernel):
    rng = np.random.default_rng(32)
    p = testing.random_problem(rng, T=6, H=64, D=128, E=64, lens=8000, top_k=256)
    first = run(p, kernel)
    again = run(p, kernel)
    np.testing.assert_array_equal(first[0], again[0])
    assert first[1].tobytes() == again[1].tobytes()
