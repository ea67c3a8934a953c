#!/usr/bin/env python3
"""Determinism and soak on the GPU (issue: hardening).

    python scripts/stress.py --replays 100 --soak 10000

determinism: every decode benchmark case, and mtp-2 and mtp-3 grouped by their sequences (the
pair kernel; mtp-3's lone rows in a second launch), fast and exact, replayed N times on the
same inputs; all outputs must be bit-identical to the first.
soak: N calls of mixed shapes (H, D, E, T, top_k, lengths, both precisions, physical,
scores) in one process; device memory held by CuPy's pool and the number of compiled
modules are reported before and after, and must not grow once every shape was seen.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer import _jit, arrays, bench, testing  # noqa: E402


def _cuda_ops():
    """``indexer.cuda_ops`` (it imports CuPy: imported once main has found a GPU)."""
    from indexer import cuda_ops  # noqa: PLC0415

    return cuda_ops


def determinism(cp, replays: int) -> int:
    bad = 0
    for name in ("decode-1M", "decode-128K", "decode-latency", "decode-ragged", "decode-E256", "mtp-2", "mtp-3"):
        case = next(c for c in bench.CASES if c.name == name)
        x, _ = bench.build(case, cp, seed=7)
        for precision in ("fast", "exact"):
            def call():
                # grouped by the case's sequences where it has them, as the bench calls it
                i, s = bench.call_case(_cuda_ops(), x, case.top_k, precision=precision, return_scores=True,
                                       validate=False)
                return i.get().tobytes() + s.get().tobytes()
            first = call()
            same = sum(call() == first for _ in range(replays - 1)) + 1
            bad += same != replays
            print(f"determinism {name:15s} {precision:5s} {same}/{replays} bit-identical", flush=True)
        x = None  # the case's arrays freed (not deleted: the closure above reads the name)
        cp.get_default_memory_pool().free_all_blocks()
    return bad


def soak(cp, calls: int) -> int:
    rng = np.random.default_rng(0)
    shapes = [(64, 128, 64), (64, 128, 256), (8, 64, 16), (128, 64, 16), (33, 96, 32), (64, 256, 64)]
    problems = []
    for H, D, E in shapes:
        for T in (1, 5):
            p = testing.random_problem(rng, T=T, H=H, D=D, E=E, L=40, top_k=64)
            problems.append((p, [cp.asarray(a) for a in p.arrays()]))
    pool = cp.get_default_memory_pool()

    def one(i):
        p, dev = problems[i % len(problems)]
        k = (16, 64, 512, 1)[i % 4]
        return _cuda_ops().score_topk(*dev, k, precision=("fast", "exact")[i % 2], physical=bool(i % 3 == 0),
                                   return_scores=bool(i % 5 == 0), validate=bool(i % 7 == 0))

    for i in range(4 * len(problems)):  # every shape, precision and k once: compile, fill the pool
        one(i)
    cp.cuda.Device().synchronize()
    mem0, mods0 = pool.total_bytes(), _jit._module.cache_info().currsize
    t0 = time.perf_counter()
    for i in range(calls):
        one(i)
    cp.cuda.Device().synchronize()
    dt = time.perf_counter() - t0
    mem1, mods1 = pool.total_bytes(), _jit._module.cache_info().currsize
    print(f"soak: {calls} calls in {dt:.1f} s; pool {mem0 / 2**20:.1f} MB -> {mem1 / 2**20:.1f} MB; "
          f"compiled modules {mods0} -> {mods1}", flush=True)
    return int(mem1 > mem0 or mods1 > mods0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--soak", type=int, default=10_000)
    args = ap.parse_args(argv)
    cp = arrays.cupy()
    if cp is None or not arrays.gpu_supported():
        print("stress: needs CuPy and a CUDA GPU of compute capability 8.0 or newer")
        return 2
    bad = determinism(cp, args.replays) if args.replays else 0
    bad += soak(cp, args.soak) if args.soak else 0
    print("stress: ok" if not bad else f"stress: {bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
