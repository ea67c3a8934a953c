"""A GPU older than the kernels run on (compute capability below 8.0: a T4, a V100) is
refused by name before anything compiles, with the inputs left as they were; the H200 is
told as this GPU with a smaller capability (``cuda_ops.device_facts``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpu import requires_gpu
from indexer import arrays, testing

pytestmark = requires_gpu


def test_check_device_refuses_only_gpus_below_sm_80():
    from indexer import cuda_ops

    dev = cuda_ops.device_facts(0)
    for cc in (80, 86, 89, 90, 100, 120):
        cuda_ops.check_device(dataclasses.replace(dev, compute_capability=cc), 0)
    for cc in (70, 75):
        with pytest.raises(RuntimeError, match=rf"backend 'cuda': GPU 0 \(.+\) has compute capability "
                                               rf"{cc // 10}\.{cc % 10}, and the CUDA kernels need 8\.0"):
            cuda_ops.check_device(dataclasses.replace(dev, compute_capability=cc), 0)


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_an_older_gpu_is_refused_before_any_launch_and_numpy_still_scores(monkeypatch, precision):
    import cupy as cp

    import indexer
    from indexer import cuda_ops

    rng = np.random.default_rng(75)
    p = testing.random_problem(rng, T=3, H=16, D=64, E=16, lens=[0, 700, 1_000], top_k=40)
    dev_args = [cp.asarray(x) for x in p.args()[:7]]
    before = [x.copy() for x in dev_args]
    real = cuda_ops.device_facts(0)
    monkeypatch.setattr(cuda_ops, "device_facts", lambda i: dataclasses.replace(real, compute_capability=75))
    cuda_ops.clear_plans()
    try:
        for backend in ("auto", "cuda"):  # device arrays: scored where they live, so refused there
            with pytest.raises(RuntimeError, match="compute capability 7.5.*backend='numpy'"):
                indexer.score_topk(*dev_args, p.top_k, backend=backend, precision=precision)
        for x, y in zip(dev_args, before):
            cp.testing.assert_array_equal(x, y)
        # what the message offers: the NumPy backend takes the device arrays (copied to the host)
        idx = indexer.score_topk(*dev_args, p.top_k, backend="numpy")
        assert isinstance(idx, np.ndarray)
        testing.check_topk(p, idx)
    finally:
        cuda_ops.clear_plans()  # no plan was cached for the refused device; none kept either way


def test_the_current_gpu_is_supported_here():
    assert arrays.gpu_supported() and arrays.compute_capability() >= arrays.MIN_COMPUTE_CAPABILITY
