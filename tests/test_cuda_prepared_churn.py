"""A ``PreparedCall`` under random churn on the GPU (hypothesis's stateful testing): calls on
a few sets of arrays whose contents are rewritten in place between calls (the same
pointers: its CUDA graphs must read the new contents), new arrays (new pointers), out=
buffers of several sets or none, another stream, and its workspace grown between calls (by
a larger call, or reserved where that one fits: the graphs captured before must not be
replayed on the old buffers). Every call's answer must equal, bit for bit, the public
call's on the same arrays at that moment (on a workspace of its own), which
``testing.check_topk`` holds to the reference."""

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import settings, strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, rule  # noqa: E402

import indexer  # noqa: E402
from indexer import arrays, testing  # noqa: E402
from tests.gpu import requires_gpu, side_stream  # noqa: E402

pytestmark = [requires_gpu, pytest.mark.gpu]

SHAPE = dict(T=3, H=64, D=128, E=64, L=8, top_k=64)
GROWN = dict(T=16, H=64, D=128, E=64, L=40, top_k=512)  # a larger call: the workspace grows
SETS = 3  # array sets at most (each a layer's pool and a step's queries, say)


def _problem(seed, shape=SHAPE):
    """Random arrays of the prepared shapes; lengths anywhere in [0, L*E], one row often empty."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, shape["L"] * shape["E"] + 1, shape["T"])
    lens[rng.integers(0, shape["T"])] *= rng.integers(0, 2)
    return testing.random_problem(rng, lens=lens, **shape)


class PreparedChurn(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        cp = arrays.cupy()
        self.cp = cp
        first = _problem(0)
        self.sets = [[cp.asarray(a) for a in first.arrays()]]
        self.ws = indexer.Workspace()
        self.step = indexer.prepare(*self.sets[0], SHAPE["top_k"], return_scores=True, workspace=self.ws)
        T, k = SHAPE["T"], SHAPE["top_k"]
        self.outs = [(cp.empty((T, k), cp.int32), cp.empty((T, k), cp.float32)) for _ in range(2)]
        self.stream = side_stream()
        self.own_ws = indexer.Workspace()  # the public call's, for the expected answers

    @rule(which=st.integers(0, SETS - 1), seed=st.integers(0, 2**32 - 1))
    def rewrite_in_place(self, which, seed):
        """New contents at the same pointers (queries, weights, pool, table and lengths)."""
        arrays_ = self.sets[which % len(self.sets)]
        for dst, src in zip(arrays_, _problem(seed).arrays()):
            dst[...] = self.cp.asarray(src)

    @rule(seed=st.integers(0, 2**32 - 1))
    def new_arrays(self, seed):
        """A new set of arrays (new pointers), the oldest dropped past SETS."""
        self.sets.append([self.cp.asarray(a) for a in _problem(seed).arrays()])
        if len(self.sets) > SETS:
            self.sets.pop(0)

    @rule(seed=st.integers(0, 2**32 - 1))
    def grow_the_workspace(self, seed):
        """A larger call on the prepared call's workspace: its buffers are replaced."""
        p = _problem(seed, GROWN)
        before = self.ws.generation
        indexer.score_topk(*[self.cp.asarray(a) for a in p.arrays()], p.top_k, workspace=self.ws, validate=False)
        if self.ws.generation == before:  # the call fitted (short rows, or grown before): grown as by a larger one
            self.ws.reserve(self.ws.nbytes + 1)
        assert self.ws.generation > before

    @rule(which=st.integers(0, SETS - 1), out=st.sampled_from([None, 0, 1]), on_stream=st.booleans())
    def call(self, which, out, on_stream):
        cp = self.cp
        arrays_ = self.sets[which % len(self.sets)]
        stream = self.stream if on_stream else cp.cuda.get_current_stream()
        target = None if out is None else self.outs[out]
        if target is not None:  # old answers in it must not pass for new ones
            target[0].fill(-7)
            target[1].fill(np.nan)
        if on_stream:  # the caller orders its writes before a call on another stream
            cp.cuda.get_current_stream().synchronize()
        got = self.step(*arrays_, out=target, stream=stream)
        if target is not None:
            assert got is target
        stream.synchronize()
        want = indexer.score_topk(*arrays_, SHAPE["top_k"], return_scores=True, validate=False,
                                  workspace=self.own_ws)
        cp.cuda.get_current_stream().synchronize()
        for a, b in zip(got, want):
            assert a.get().tobytes() == b.get().tobytes()

    def teardown(self):
        # the last answer against the reference itself (each call above equals the public call)
        p = testing.Problem(*[a.get() for a in self.sets[-1]], SHAPE["top_k"])
        idx, sc = self.step(*self.sets[-1])
        testing.check_topk(p, idx.get(), sc.get(), tol=testing.TOL_FAST)


PreparedChurn.TestCase.settings = settings(max_examples=20, stateful_step_count=25, deadline=None)
test_prepared_call_under_churn = PreparedChurn.TestCase
