"""score_topk_ragged on the GPU against the per-token reference: causal prefill rows,
multi-token decode groups, empty groups and groups of one."""

import numpy as np
import pytest

import indexer
from indexer import arrays, testing
from tests.gpu import requires_gpu
from tests.test_ragged import as_problem, grouped_problem

pytestmark = [requires_gpu, pytest.mark.gpu]
TOL = {"exact": testing.TOL_EXACT, "fast": testing.TOL_FAST}


@pytest.mark.parametrize("precision", ["fast", "exact"])
@pytest.mark.parametrize("counts,ratio,top_k", [
    ([300], 4, 16),            # causal prefill: rows see 0 .. 75 entries, many shorter than k
    ([2, 2, 2, 2], None, 64),  # multi-token decode
    ([0, 5, 0, 1, 0], None, 32),  # empty groups and a group of one
    ([1], None, 8),
])
def test_ragged_matches_reference(precision, counts, ratio, top_k):
    cp = arrays.cupy()
    rng = np.random.default_rng(sum(counts) + top_k)
    args = grouped_problem(rng, counts, H=64, D=128, E=64, seq_entries=[500] * len(counts), ratio=ratio, top_k=top_k)
    dev = [cp.asarray(a) for a in args]
    idx, sc = indexer.score_topk_ragged(*dev, top_k, precision=precision, return_scores=True)
    testing.check_topk(as_problem(*args, top_k), idx.get(), sc.get(), tol=TOL[precision])
    phys = indexer.score_topk_ragged(*dev, top_k, precision=precision, physical=True)
    testing.check_topk(as_problem(*args, top_k), phys.get(), tol=TOL[precision], physical=True)


def test_ragged_validate_false_with_malformed_offsets_stays_in_bounds():
    cp = arrays.cupy()
    rng = np.random.default_rng(40)
    args = list(grouped_problem(rng, [3, 2], H=8, D=64, E=16))
    args[6] = np.array([0, 9, 1], dtype=np.int32)  # malformed: not monotone, past T
    dev = [cp.asarray(a) for a in args]
    idx = indexer.score_topk_ragged(*dev, 4, validate=False)
    cp.cuda.Device().synchronize()
    assert idx.shape == (5, 4)
