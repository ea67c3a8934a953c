#!/usr/bin/env python3
"""Run every kernel instance on small inputs under compute-sanitizer (memcheck, racecheck,
synccheck) and summarise what each tool reported.

    python scripts/sanitize.py                  # all tools, summary table
    python scripts/sanitize.py --tools memcheck
    python scripts/sanitize.py --cases          # the workload alone (what the tools run)

The workload covers every head-group instance of the score kernel, the keys-stationary and
dense kernels, and both select instances, with adversarial inputs: ragged and empty rows,
lengths off block edges, NaN, and, with validation off, out-of-range block ids and lengths
past L*E.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ml_dtypes():
    """ml_dtypes where installed (NumPy's float8), else None."""
    try:
        import ml_dtypes  # noqa: PLC0415  (optional)
    except ImportError:
        return None
    return ml_dtypes


def bad_inputs(rng, H, D, top_k):
    """A problem whose block table has ids out of range for visible blocks (too large and
    negative) and whose lengths run past L*E and below 0: for calls with validation off."""
    from indexer import testing

    p = testing.random_problem(rng, T=3, H=H, D=D, E=16, lens=48, L=3, top_k=top_k)
    p.block_table[0, 1] = 10**6
    p.block_table[1, 0] = -7
    p.valid_lens[2] = 10**6
    p.valid_lens[1] = -3
    return p


def ragged_sequences(rng, counts, E, entries):
    """q, w, the pool arrays, a (B, L) block table, cu_seqlens and causal lengths of B
    sequences of counts[b] rows over entries[b] entries each (H = 64, D = 128)."""
    import numpy as np

    from indexer import testing

    L = max(-(-n // E) for n in entries)
    P = len(counts) * L + 3
    base = testing.random_problem(rng, T=1, H=64, D=128, E=E, L=L, P=P, lens=1, top_k=40)
    table = rng.permutation(P)[: len(counts) * L].reshape(len(counts), L).astype(np.int32)
    lens = np.concatenate([np.minimum(n, n - r + 1 + np.arange(r)) for r, n in zip(counts, entries)]).astype(np.int32)
    T = int(sum(counts))
    q = rng.standard_normal((T, 64, 128)).astype(np.float32)
    w = rng.standard_normal((T, 64)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return q, w, base.keys_fp4, base.key_scale, base.key_gscale, table, cu, lens


def cases():
    import numpy as np

    from indexer import arrays, score_topk, testing

    cp = arrays.cupy()
    rng = np.random.default_rng(0)
    shapes = [(1, 32, 16, 5), (16, 64, 16, 20), (32, 64, 32, 40), (64, 128, 64, 300), (128, 64, 16, 64),
              (24, 96, 16, 10), (8, 256, 16, 12), (40, 160, 32, 9)]
    ran = 0
    for H, D, E, k in shapes:
        p = testing.random_problem(rng, T=3, H=H, D=D, E=E, L=6, top_k=k)
        for precision in ("exact", "fast"):
            score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, backend="cuda", precision=precision,
                       return_scores=True)
            ran += 1
    # the 1024-thread select: rows longer than 4096 entries
    p = testing.random_problem(rng, T=2, H=8, D=64, E=64, lens=[5000, 4097], top_k=4096)
    score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, backend="cuda", physical=True)
    ran += 1
    for kind in testing.ADVERSARIAL_KINDS:
        p = testing.adversarial_problem(kind, rng)
        for precision in ("exact", "fast"):
            score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, backend="cuda", precision=precision,
                       return_scores=True)
            ran += 1
    # the wgmma kernel's schedules and bulk-copy runs: a balanced ragged batch (empty rows,
    # rows spanning CTAs), 2- and 256-entry blocks, and more rows than the balanced schedule
    # holds (runs of tiles per row)
    for T, E, max_len in ((20, 64, 3000), (9, 2, 600), (5, 256, 2000), (1030, 16, 150)):
        lens = rng.integers(0, max_len + 1, size=T)
        lens[: T // 4] = 0
        p = testing.random_problem(rng, T=T, H=64, D=128 if T < 1000 else 32, E=E, lens=lens, top_k=33)
        score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, backend="cuda", precision="fast",
                   return_scores=True)
        ran += 1
    # the pair kernel (rows of one sequence sharing key tiles): odd groups, an empty group,
    # a row past 256 tiles (packed-histogram flush); then the same with bad ids, validation off
    from indexer import score_topk_ragged
    counts, E, L = [3, 1, 0, 4, 2], 64, 9
    base = testing.random_problem(rng, T=1, H=64, D=128, E=E, L=L, P=len(counts) * L + 2, lens=1, top_k=40)
    table = rng.permutation(base.keys_fp4.shape[0])[: len(counts) * L].reshape(len(counts), L).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    T = int(cu[-1])
    lens = rng.integers(0, L * E + 1, size=T).astype(np.int32)
    q = rng.standard_normal((T, 64, 128)).astype(np.float32)
    w = rng.standard_normal((T, 64)).astype(np.float32)
    pool = [cp.asarray(a) for a in (base.keys_fp4, base.key_scale, base.key_gscale)]
    score_topk_ragged(cp.asarray(q), cp.asarray(w), *pool, cp.asarray(table), cp.asarray(cu), cp.asarray(lens), 40,
                      backend="cuda", return_scores=True)
    table[1, 0], table[3, 2], lens[4] = 10**6, -5, 10**6
    score_topk_ragged(cp.asarray(q), cp.asarray(w), *pool, cp.asarray(table), cp.asarray(cu), cp.asarray(lens), 40,
                      backend="cuda", validate=False)
    ran += 2
    long = testing.random_problem(rng, T=1, H=64, D=128, E=E, L=600, lens=600 * E, top_k=300)
    two = [cp.asarray(a) for a in (np.repeat(long.q, 2, 0), np.repeat(long.w, 2, 0), long.keys_fp4, long.key_scale,
                                   long.key_gscale, long.block_table[:1], np.array([0, 2], np.int32),
                                   np.array([600 * E, 600 * E - 77], np.int32))]
    score_topk_ragged(*two, 300, backend="cuda")
    ran += 1
    # the warp-specialised kernel (forced): ragged batches with empty rows, 2- and 256-entry
    # blocks, one long row; then bad ids and lengths with validation off
    from indexer import cuda_ops
    for T, E, max_len in ((20, 64, 3000), (9, 2, 600), (5, 256, 2000), (1, 64, 20000)):
        lens = rng.integers(0, max_len + 1, size=T)
        lens[: T // 4] = 0
        p = testing.random_problem(rng, T=T, H=64, D=128, E=E, lens=lens, top_k=33)
        cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, return_scores=True, _fast_kernel="ws")
        ran += 1
    p = bad_inputs(rng, H=64, D=128, top_k=20)
    cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, validate=False, physical=True,
                        _fast_kernel="ws")
    ran += 1
    # the keys-stationary and dense kernels (forced): one sequence of causal rows over 2-entry
    # blocks, rows short of most groups in a long pool, then bad ids and lengths with
    # validation off; several sequences (one empty), then their offsets out of order
    for kernel in ("ks", "dense"):
        for rows, E, entries, short in ((50, 2, 900, False), (30, 64, 9000, True), (12, 64, 3000, False)):
            q, w, k, s, g, table, cu, lens = ragged_sequences(rng, [rows], E, [entries])
            if short:
                lens = np.minimum(lens, 1500)
                lens[3] = entries
            x = [cp.asarray(a) for a in (q, w, k, s, g, np.repeat(table, rows, 0), lens)]
            bad = rows == 12
            if bad:
                x[5][0, 1], x[5][4, 0], x[6][2] = 10**6, -7, 10**6
            # the keys-stationary kernel's runs also with each row's threshold sampled (the
            # default for its runs of many rows; these few would rank)
            for select in ("auto", "sampled") if kernel == "ks" else ("auto",):
                cuda_ops.score_topk(*x, 40, return_scores=not bad, validate=not bad, _cu_seqlens=cp.asarray(cu),
                                    _fast_kernel=kernel, _select=select)
                ran += 1
        q, w, k, s, g, table, cu, lens = ragged_sequences(rng, [20, 0, 30, 1], 64, [3000, 100, 9000, 500])
        x = [cp.asarray(a) for a in (q, w, k, s, g, np.repeat(table, np.diff(cu), 0), lens)]
        for offsets, valid in ((cu, True), (np.array([0, 40, 7, 60, 2], np.int32), False)):
            cuda_ops.score_topk(*x, 40, validate=valid, _cu_seqlens=cp.asarray(offsets), _fast_kernel=kernel)
            ran += 1
    # batch 1 ranks every pair of its candidates: random scores, then a plateau of exact
    # zeros (3,000 tied candidates)
    p = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=[30000], top_k=1024)
    cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, return_scores=True, _select="multi")
    p = testing.random_problem(rng, T=1, H=8, D=64, E=64, lens=[3000], top_k=1024)
    p.keys_fp4, p.key_scale, p.key_gscale = testing.quantize_blocks(
        np.abs(rng.standard_normal(p.keys_fp4.shape[:2] + (64,))).astype(np.float32))
    p.q = -np.abs(p.q) - np.float32(0.1)
    cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, return_scores=True, _select="multi")
    ran += 2
    # an SM's worth of rows streams each row through one CTA (its candidates gathered and
    # ranked in shared memory): ragged rows with an empty one, then a plateau past the CTA's
    # 4,096 candidate slots (the radix select over the row)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    p = testing.random_problem(rng, T=sms, H=8, D=64, E=64, lens=np.r_[0, rng.integers(1, 9000, sms - 1)],
                               top_k=1024)
    cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, return_scores=True, _select="multi")
    p = testing.zero_plateau(testing.random_problem(rng, T=sms, H=8, D=64, E=64, lens=rng.integers(4200, 6000, sms),
                                                    top_k=100), rng)
    cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, return_scores=True, _select="multi")
    ran += 2
    # the short-row select with each row one plateau of exact zeros (one crowded bucket): every
    # form (rows of up to 512, 1,024, 1,536 and 2,048 entries) falls back to the shared radix
    # select, which reads the row again
    p = testing.zero_plateau(testing.random_problem(rng, T=8, H=8, D=64, E=64,
                                                    lens=[300, 512, 513, 1024, 1025, 1536, 1537, 2000], top_k=100), rng)
    cuda_ops.score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, return_scores=True)
    ran += 1
    # on a workspace (histograms zero at rest) and replayed from CUDA graphs, where the
    # select kernels are launched to overlap their predecessor: batch 1, a few rows, an
    # SM's worth of rows (the streamed select), and prefill-like causal rows (pair scoring,
    # then the short-row select)
    import indexer
    ws = indexer.Workspace()
    stream = cp.cuda.Stream(non_blocking=True)
    few = testing.random_problem(rng, T=5, H=64, D=128, E=64, lens=[9000, 0, 4097, 7000, 100], top_k=300)
    batch1 = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=[30000], top_k=1024)
    streamed = testing.random_problem(rng, T=sms, H=8, D=64, E=64, lens=rng.integers(4097, 9000, sms), top_k=512)
    cu = np.array([0, 300], np.int32)
    causal = [cp.asarray(a) for a in (rng.standard_normal((300, 64, 128)).astype(np.float32),
                                      rng.standard_normal((300, 64)).astype(np.float32), *pool, table[:1],
                                      cu, indexer.causal_lens(cu, ratio=4, context_lens=[100]))]
    calls = []
    for p in (few, batch1, streamed):
        x, out = [cp.asarray(a) for a in p.arrays()], cp.empty((p.q.shape[0], p.top_k), cp.int32)
        calls.append(lambda x=x, out=out, k=p.top_k: score_topk(*x, k, backend="cuda", validate=False, out=out,
                                                                 workspace=ws))
    out = cp.empty((300, 64), cp.int32)
    calls.append(lambda: score_topk_ragged(*causal, 64, backend="cuda", validate=False, out=out, workspace=ws))
    with stream:  # inputs and outputs allocated above: the captures allocate nothing
        for call in calls:
            call()  # eager, and sizes the workspace
            stream.synchronize()
            stream.begin_capture()
            try:
                call()
            finally:
                graph = stream.end_capture()
            graph.launch(stream)
            graph.launch(stream)
            stream.synchronize()
            ran += 3
    # float16 and float8 queries through every kernel that reads q (their instances): the
    # exact path, mma.sync's and the wgmma kernels' staging, the warp-specialised kernel's
    # own; the pair kernel staging them itself, the keys-stationary and dense kernels. (A
    # float8 query as ml_dtypes' host array: its bits go to the device, read as e4m3_bits.)
    narrow = [np.float16] + ([ml_dtypes.float8_e4m3fn] if (ml_dtypes := _ml_dtypes()) is not None else [])
    for dtype in narrow:
        p = testing.random_problem(rng, T=3, H=64, D=128, E=64, lens=[5000, 0, 777], top_k=50)
        half = [p.q.astype(dtype)] + [cp.asarray(a) for a in p.arrays()[1:]]
        for kernel, precision in (("auto", "exact"), ("mma", "fast"), ("wgmma-single", "fast"), ("ws", "fast")):
            cuda_ops.score_topk(*half, p.top_k, precision=precision, return_scores=True, _fast_kernel=kernel)
            ran += 1
        q, w, k, s, g, table, cu, lens = ragged_sequences(rng, [3, 1, 20], 64, [3000, 500, 2048])
        x = [q.astype(dtype)] + [cp.asarray(a) for a in (w, k, s, g, np.repeat(table, np.diff(cu), 0), lens)]
        for kernel in ("pairs", "ks", "dense"):
            cuda_ops._QUERY_IMAGE = kernel != "pairs"
            cuda_ops.clear_plans()
            cuda_ops.score_topk(*x, 40, _cu_seqlens=cp.asarray(cu), _fast_kernel=kernel)
            ran += 1
    cuda_ops._QUERY_IMAGE = True
    cuda_ops.clear_plans()
    # validation off, bad inputs, both paths
    p = bad_inputs(rng, H=8, D=64, top_k=64)
    for precision in ("exact", "fast"):
        score_topk(*[cp.asarray(a) for a in p.arrays()], p.top_k, backend="cuda", precision=precision,
                   validate=False, physical=True)
        ran += 1
    cp.cuda.Device().synchronize()
    print(f"sanitize workload: {ran} calls ran")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", default="memcheck,racecheck,synccheck")
    ap.add_argument("--cases", action="store_true", help="run the workload only")
    args = ap.parse_args(argv)
    if args.cases:  # (the child the sanitizer runs: a CUDA error of its own shows as it is)
        cases()
        return 0
    from indexer import arrays  # noqa: PLC0415

    if not arrays.gpu_supported():
        print("sanitize: needs CuPy and a CUDA GPU of compute capability 8.0 or newer")
        return 2
    cases()  # compile every instance first, outside the sanitizer (fills CuPy's disk cache)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    failed = 0
    rows = []
    for tool in args.tools.split(","):
        # synccheck tracks every mbarrier (the wgmma kernel's key ring: 4 per CTA); its default
        # table overflows and then fails the launch, so size it for a few thousand CTAs
        extra = ["--num-cuda-barriers", "16384"] if tool == "synccheck" else []
        cmd = ["compute-sanitizer", "--tool", tool, *extra, "--error-exitcode", "3", sys.executable, __file__,
               "--cases"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        out = proc.stdout + proc.stderr
        m = re.search(r"ERROR SUMMARY: (\d+) error", out) or re.search(r"RACECHECK SUMMARY: \d+ hazards displayed \((\d+) error", out)
        errors = int(m.group(1)) if m else -1
        ok = proc.returncode == 0 and errors == 0
        failed += not ok
        rows.append((tool, errors, proc.returncode))
        if not ok:
            print(out[-4000:])
    for tool, errors, rc in rows:
        print(f"{tool:10s} errors {errors:3d}  exit {rc}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
