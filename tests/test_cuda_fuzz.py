"""Differential fuzzing: hypothesis draws shapes and values, every GPU path is checked
against the float64 reference with the contract's tolerance.

The number of examples comes from INDEXER_FUZZ_EXAMPLES (default 40; the device runs use
1,000). Values include adversarial draws: duplicated blocks (exact ties), zero plateaus,
NaN queries and scales, extreme global scales, lengths on and off block edges.
"""

import os

import numpy as np
import pytest

from indexer import arrays, testing
from tests.gpu import requires_gpu

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

pytestmark = [requires_gpu, pytest.mark.gpu]
EXAMPLES = int(os.environ.get("INDEXER_FUZZ_EXAMPLES", "40"))
TOL = {"exact": testing.TOL_EXACT, "fast": testing.TOL_FAST}


@st.composite
def problems(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    H = draw(st.sampled_from([1, 3, 8, 16, 33, 64, 128]))
    D = draw(st.sampled_from([32, 64, 96, 128, 256]))
    E = draw(st.sampled_from([1, 2, 7, 16, 64, 128, 256]))
    T = draw(st.integers(1, 6))
    top_k = draw(st.sampled_from([1, 2, 5, 16, 100, 513, 2048]))
    max_len = draw(st.sampled_from([1, E, E + 1, 3 * E - 1, 700, 5000]))
    lens = rng.integers(0, max_len + 1, size=T)
    p = testing.random_problem(rng, T=T, H=H, D=D, E=E, lens=lens, top_k=top_k)
    twist = draw(st.sampled_from(["none", "ties", "plateau", "nan", "scales"]))
    P = p.keys_fp4.shape[0]
    if twist == "ties" and P > 1:
        for a in (p.keys_fp4, p.key_scale, p.key_gscale):
            a[1::2] = a[0:P - P % 2:2][: a[1::2].shape[0]]
    elif twist == "plateau":
        keys = np.abs(rng.standard_normal((P, E, D))).astype(np.float32)
        p.keys_fp4, p.key_scale, p.key_gscale = testing.quantize_blocks(keys)
        p.q = -np.abs(p.q) - np.float32(0.1)
        p.w = np.abs(p.w) + np.float32(0.1)
    elif twist == "nan":
        p.q[rng.integers(T), rng.integers(H), rng.integers(D)] = np.nan
        p.key_scale[rng.integers(P), rng.integers(E), rng.integers(D // 16)] = 0x7F
    elif twist == "scales":
        p.key_gscale[:] = np.exp2(rng.integers(-40, 41, size=P)).astype(np.float32)
        p.q *= np.float32(10.0) ** rng.integers(-6, 7, size=(T, 1, 1)).astype(np.float32)
    return p


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_gpu_paths_match_the_reference(precision):
    cp = arrays.cupy()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(problems())
    def check(p):
        dev = [cp.asarray(a) for a in p.arrays()]
        from indexer import score_topk

        idx, sc = score_topk(*dev, p.top_k, backend="cuda", precision=precision, return_scores=True)
        testing.check_topk(p, idx.get(), sc.get(), tol=TOL[precision])

    check()
