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
@pytest.mark.parametrize("shared_workspace", [False, True])
def test_gpu_paths_match_the_reference(precision, shared_workspace):
    # shared_workspace: one Workspace for every example (shapes, routes and twists in any
    # order), its at-rest histograms checked zero after each call
    import indexer

    cp = arrays.cupy()
    ws = indexer.Workspace() if shared_workspace else None

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(problems())
    def check(p):
        dev = [cp.asarray(a) for a in p.arrays()]
        idx, sc = indexer.score_topk(*dev, p.top_k, backend="cuda", precision=precision, return_scores=True,
                                     workspace=ws)
        testing.check_topk(p, idx.get(), sc.get(), tol=TOL[precision])
        at_rest = ws._buffers.get((cp.cuda.runtime.getDevice(), "zeroed")) if ws is not None else None
        if at_rest is not None:
            assert int(cp.count_nonzero(at_rest)) == 0

    check()


@st.composite
def grouped_problems(draw):
    """score_topk_ragged inputs: B sequences with their own block tables, 0-6 query rows
    each, lengths random or causal (with a cached prefix), optional plateaus and NaN. Shapes
    the pair kernel takes (H <= 64, D <= 128, E a power of two) are drawn most often."""
    import indexer

    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    H = draw(st.sampled_from([8, 33, 64, 64]))
    D = draw(st.sampled_from([32, 64, 96, 128, 128]))  # every head dim the pair kernel is built for
    E = draw(st.sampled_from([2, 16, 64, 64, 128, 7]))
    B = draw(st.integers(1, 4))
    counts = [draw(st.integers(0, 6)) for _ in range(B)]
    if sum(counts) == 0:
        counts[0] = 1
    entries = [draw(st.sampled_from([1, E, 3 * E + 1, 700, 5000])) for _ in range(B)]
    if draw(st.booleans()) and sum(counts) <= 4:  # past 256 tiles: packed histograms flushed
        entries[0] = 33_000
    top_k = draw(st.sampled_from([1, 7, 64, 300, 1024]))
    L = max(-(-n // E) for n in entries)
    base = testing.random_problem(rng, T=1, H=H, D=D, E=E, L=L, P=B * L + 3, lens=1, top_k=top_k)
    table = rng.permutation(B * L + 3)[: B * L].reshape(B, L).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    T = int(cu[-1])
    per_row_entries = np.repeat(entries, counts)
    if draw(st.booleans()):
        lens = rng.integers(0, per_row_entries + 1)
    else:  # causal: the rows of a sequence see one more entry every `ratio` tokens
        context = rng.integers(0, 4 * np.array(entries) + 1)
        lens = np.minimum(indexer.causal_lens(cu, ratio=4, context_lens=context), per_row_entries)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    w = rng.standard_normal((T, H)).astype(np.float32)
    keys_fp4, key_scale, key_gscale = base.keys_fp4, base.key_scale, base.key_gscale
    twist = draw(st.sampled_from(["none", "none", "plateau", "nan"]))
    if twist == "plateau":  # every score exactly 0: the lowest indices win
        keys = np.abs(rng.standard_normal((keys_fp4.shape[0], E, D))).astype(np.float32)
        keys_fp4, key_scale, key_gscale = testing.quantize_blocks(keys)
        q = -np.abs(q) - np.float32(0.1)
        w = np.abs(w) + np.float32(0.1)
    elif twist == "nan":
        q[rng.integers(T), rng.integers(H), rng.integers(D)] = np.nan
    return q, w, keys_fp4, key_scale, key_gscale, table, cu, lens.astype(np.int32), top_k


def test_ragged_calls_match_the_reference_and_the_per_row_path():
    # score_topk_ragged (rows of a sequence in pairs sharing key tiles where the pair kernel
    # applies, and forced on every draw it takes) against the reference, and bit for bit
    # against the same rows scored one by one from the host's per-token table by the
    # single-query kernel of the same arithmetic. Where
    # the grouped call takes the warp-specialised kernel (no more rows than sequences, a few
    # long rows: geometry.ws_preferred), that is the same kernel, so the bits check the grouped
    # call's own table (expanded on the device) and routing; the dense kernel, which gives the
    # warp-specialised kernel's bits, checks the arithmetic there where it applies
    import indexer
    from indexer import cuda_ops, validate

    cp = arrays.cupy()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(grouped_problems())
    def check(args):
        q, w, k, s, g, table, cu, lens, top_k = args
        per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
        p = testing.Problem(q, w, k, s, g, per_token, lens, top_k)
        dev = [cp.asarray(a) for a in (q, w, k, s, g, table, cu, lens)]
        idx, sc = indexer.score_topk_ragged(*dev, top_k, backend="cuda", return_scores=True)
        testing.check_topk(p, idx.get(), sc.get(), tol=TOL["fast"])
        rows = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
        facts = cuda_ops.device_facts(cp.cuda.Device().id)
        grouped_kind = cuda_ops._scoring_kernel("fast", validate.check_score_topk(*rows, top_k), facts, rows[0],
                                                rows[3], "auto", dev[6])
        wgmma = cuda_ops.geometry.wgmma_supported(q.shape[1], q.shape[2], facts, k.shape[1])
        one, one_sc = cuda_ops.score_topk(*rows, top_k, return_scores=True, _cu_seqlens=dev[6],
                                          _fast_kernel="ws" if grouped_kind == "ws" else "wgmma-single"
                                          if wgmma else "auto")
        np.testing.assert_array_equal(idx.get(), one.get())
        assert sc.get().tobytes() == one_sc.get().tobytes()
        if wgmma:
            # the pair kernel forced ('wgmma': pairs wherever rows outnumber sequences, at any
            # work; auto pairs them only past geometry.PAIRS_MIN_WORK), bit for bit the
            # single-query kernel's answers
            single = (one, one_sc) if grouped_kind != "ws" else cuda_ops.score_topk(
                *rows, top_k, return_scores=True, _cu_seqlens=dev[6], _fast_kernel="wgmma-single")
            paired, paired_sc = cuda_ops.score_topk(*rows, top_k, return_scores=True, _cu_seqlens=dev[6],
                                                    _fast_kernel="wgmma")
            np.testing.assert_array_equal(paired.get(), single[0].get())
            assert paired_sc.get().tobytes() == single[1].get().tobytes()
        if grouped_kind == "ws" and cuda_ops.geometry.dense_supported(q.shape[1], q.shape[2], facts, k.shape[1]):
            dense, dense_sc = cuda_ops.score_topk(*rows, top_k, return_scores=True, _cu_seqlens=dev[6],
                                                  _fast_kernel="dense")
            np.testing.assert_array_equal(idx.get(), dense.get())
            assert sc.get().tobytes() == dense_sc.get().tobytes()

    check()


def test_dense_kernel_matches_the_reference_and_the_ws_kernel():
    # the dense kernel forced on the grouped draws it takes (H <= 64, D = 128, E a power of
    # two; many rows a sequence are not needed for it to be right): against the reference,
    # and bit for bit against the warp-specialised kernel, which stages the same operands
    from hypothesis import assume

    from indexer import cuda_ops, geometry

    cp = arrays.cupy()
    facts = cuda_ops.device_facts(cp.cuda.Device().id)
    if not geometry.dense_supported(64, 128, facts):
        pytest.skip("the dense kernel is a Hopper wgmma kernel")

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(grouped_problems())
    def check(args):
        q, w, k, s, g, table, cu, lens, top_k = args
        assume(geometry.dense_supported(q.shape[1], q.shape[2], facts, k.shape[1]))
        per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
        p = testing.Problem(q, w, k, s, g, per_token, lens, top_k)
        rows = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
        idx, sc = cuda_ops.score_topk(*rows, top_k, return_scores=True, _cu_seqlens=cp.asarray(cu),
                                      _fast_kernel="dense")
        testing.check_topk(p, idx.get(), sc.get(), tol=TOL["fast"])
        ws, ws_sc = cuda_ops.score_topk(*rows, top_k, return_scores=True, _fast_kernel="ws")
        np.testing.assert_array_equal(idx.get(), ws.get())
        assert sc.get().tobytes() == ws_sc.get().tobytes()

    check()
