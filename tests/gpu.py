"""What the GPU tests share: the skip rule (they run where CuPy sees a CUDA device the kernels
run on, else skip), problem pairs for refilling captured inputs, a plateau of tied scores, calls from several threads, the
NumPy answer for one score row of the select kernels' direct tests, an input and an
``out=`` array laid out in one buffer (the CPU tests of ``out=`` take it too), and a
geometry rule changed for a block of calls."""

import concurrent.futures
import contextlib
import sys

import numpy as np
import pytest

import indexer
from indexer import arrays, testing

# a GPU older than the kernels run on (a T4) is refused by name (tests/test_cuda_device_support.py
# tells the H200 it is one): the GPU tests skip there as where there is none
requires_gpu = pytest.mark.skipif(not arrays.gpu_supported(),
                                  reason="needs CuPy and a CUDA GPU of compute capability 8.0 or newer")


def in_one_buffer(x, T, k, overlap, xp=np):
    """(a copy of array ``x``, an int32 (T, k) array) in one buffer of module ``xp``: the
    second starts at ``x``'s last 4 bytes (``overlap``) or just past them."""
    assert x.nbytes % 4 == 0
    start = x.nbytes - 4 if overlap else x.nbytes
    raw = xp.empty((start + T * k * 4) // 4, dtype=xp.int32).view(xp.uint8)  # 4-byte aligned
    copy = raw[: x.nbytes].view(x.dtype).reshape(x.shape)
    copy[...] = x
    return copy, raw[start:].view(xp.int32).reshape(T, k)


def row_topk(row, n, k):
    """NumPy's (indices int32 [k], scores float32 [k]) of a float32 score row's first n
    entries: score descending, then index ascending, NaN never selected, -1 / -inf padding."""
    s = row[:n]
    ok = np.flatnonzero(~np.isnan(s))
    order = ok[np.lexsort((ok, -s[ok].astype(np.float64)))][:k]
    idx = np.full(k, -1, dtype=np.int32)
    sc = np.full(k, -np.inf, dtype=np.float32)
    idx[: order.size] = order
    sc[: order.size] = s[order]
    return idx, sc


def pair_of_problems(seed, **kw):
    """Two random problems of identical shapes (for refilling captured inputs in place)."""
    a = testing.random_problem(np.random.default_rng(seed), **kw)
    b = testing.random_problem(np.random.default_rng(seed + 1), **kw)
    assert all(x.shape == y.shape for x, y in zip(a.arrays(), b.arrays()))
    return a, b


def warmed_stream_case(seed, upload, make_out, synchronize):
    """The stream tests' start: two problems of one small shape (T 3, k 50), the first's
    arrays uploaded (`upload(p)`: the inputs a test refills in place on a busy stream) and
    the second's (the refill), the reference answer for the second, an out= buffer
    (`make_out(T, k)`), and one warm-up call into it (kernels compiled, the memory pool
    filled), then `synchronize()`. Returns (p, inputs, refill, expected, out)."""
    p, p2 = pair_of_problems(seed, T=3, H=16, D=64, E=32, lens=700, top_k=50)
    x, new = upload(p), upload(p2)
    expected = indexer.score_topk(*new, p2.top_k, return_scores=True)
    testing.check_topk(p2, *(arrays.to_numpy(x) for x in expected), tol=testing.TOL_FAST)  # right, not only equal
    out = make_out(3, 50)
    indexer.score_topk(*x, p.top_k, return_scores=True, validate=False, out=out)  # warm-up
    synchronize()
    return p, x, new, expected, out


def check_rows(p: testing.Problem, idx, sc, rows, tol=testing.TOL_FAST):
    """``testing.check_topk`` on the query rows ``rows`` of problem ``p`` and of its answer
    (``idx``, ``sc``: NumPy (T, top_k)): the reference for a sample of a run too large to
    check whole on the host (rows are independent)."""
    rows = np.asarray(rows)
    sub = testing.Problem(p.q[rows], p.w[rows], p.keys_fp4, p.key_scale, p.key_gscale,
                          np.ascontiguousarray(p.block_table[rows]), p.valid_lens[rows], p.top_k)
    testing.check_topk(sub, idx[rows], None if sc is None else sc[rows], tol=tol)


@contextlib.contextmanager
def geometry_rules(**rules):
    """``indexer.geometry``'s NAME = value for each rule given, inside the block, the cached
    launch plans cleared on entering and on leaving it (plans are cached by call shape, not
    by rule), so that the block's calls follow the changed rules: ``indexer.cuda_ops``'
    plans, and the PyTorch operators' prepared calls (``torch_ops._PREPARED``, where that
    module is loaded). A ``PreparedCall`` the test made itself before the block keeps the
    plan it holds."""
    from indexer import cuda_ops, geometry

    def clear():
        cuda_ops.clear_plans()
        ops = sys.modules.get("indexer.torch_ops")
        if ops is not None:
            ops._PREPARED.clear()
            ops._SIGHTED.clear()

    old = {name: getattr(geometry, name) for name in rules}
    for name, value in rules.items():
        setattr(geometry, name, value)
    clear()
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(geometry, name, value)
        clear()


def pairs_at_any_work():
    """The pair kernel's work bounds at 0 (geometry.pairs_pay): a grouped call whose rows
    outnumber its sequences takes it under 'auto' however little its work, as calls of more
    work do."""
    return geometry_rules(PAIRS_MIN_WORK=0, PAIRS_SPLIT_MIN_WORK=0)


def side_stream():
    """A non-blocking CuPy stream, made once the legacy null stream's work has ended: the
    tests copy their arrays to the device on that stream (``cp.asarray``), a non-blocking
    stream is not ordered after it, and a copy from pageable host memory may still be in
    flight when it returns (a call on a new stream once read a part of its keys before they
    landed: docs/performance.md v101)."""
    cp = arrays.cupy()
    cp.cuda.Stream.null.synchronize()
    return cp.cuda.Stream(non_blocking=True)


def check_threads(problems, device_of):
    """Thread i scores problems[i] (a list) on GPU device_of(i), on its own non-blocking
    stream with its own workspace, into out= buffers; every result meets the reference's
    contract (fast path)."""
    cp = arrays.cupy()

    def work(i):
        results = []
        with cp.cuda.Device(device_of(i)):
            stream = side_stream()
            ws = indexer.Workspace()  # one workspace per stream
            with stream:
                for p in problems[i]:
                    dev = [cp.asarray(a) for a in p.arrays()]
                    T = p.q.shape[0]
                    out = (cp.full((T, p.top_k), -7, dtype=cp.int32), cp.full((T, p.top_k), 7.0, dtype=cp.float32))
                    indexer.score_topk(*dev, p.top_k, return_scores=True, out=out, workspace=ws)
                    results.append((out[0].get(), out[1].get()))
        return results

    with concurrent.futures.ThreadPoolExecutor(len(problems)) as pool:
        done = list(pool.map(work, range(len(problems))))
    for i, batch in enumerate(problems):
        for p, (idx, sc) in zip(batch, done[i]):
            testing.check_topk(p, idx, sc, tol=testing.TOL_FAST)


def check_grouped_kernel_limits(kernel, max_seqs, grouped_problem):
    """A forced grouped kernel ('ks', 'dense') refuses more than ``max_seqs`` sequences by
    name, and with validation off takes offsets out of order and past the rows without
    reading or writing outside the arrays. ``grouped_problem`` is tests.test_ragged's."""
    from indexer import cuda_ops

    cp = arrays.cupy()
    rng = np.random.default_rng(5)
    counts = [1] * (max_seqs + 1)
    q, w, k, s, g, table, cu, lens = grouped_problem(rng, counts, H=64, D=128, E=64,
                                                     seq_entries=[300] * len(counts), top_k=16)
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    with pytest.raises(ValueError, match=f"fast_kernel: '{kernel}' scores the rows of 1 to {max_seqs} sequences"):
        cuda_ops.score_topk(*dev, 16, _cu_seqlens=cp.asarray(cu), _fast_kernel=kernel)
    q, w, k, s, g, table, cu, lens = grouped_problem(rng, [30, 20], H=64, D=128, E=64, seq_entries=[3000, 2500],
                                                     top_k=16)
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    idx = cuda_ops.score_topk(*dev, 16, validate=False, _cu_seqlens=cp.asarray(np.array([0, 90, 7], np.int32)),
                              _fast_kernel=kernel)
    cp.cuda.Device().synchronize()
    assert idx.shape == (50, 16)
    got = idx.get()
    assert np.all((got >= -1) & (got < lens[:, None])), got  # only entries each row can see
