"""Where an eager call spends its host time (batch 1, 262,144 entries, k 1024, CuPy arrays,
out= and a workspace given, validate=False): score_topk and a prepared call without graphs,
each its median host time, then cProfile's busiest functions over 2,000 calls.

    PYTHONPATH=. python exp/eager_profile.py
"""

import cProfile
import pstats
import time

import cupy as cp
import numpy as np

import indexer
from indexer import testing


def host_us(fn, n=300):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) % 10 == 0:
            cp.cuda.Device().synchronize()
    cp.cuda.Device().synchronize()
    return float(np.median(times) * 1e6)


def main():
    p = testing.random_problem(np.random.default_rng(0), T=1, H=64, D=128, E=64, lens=[262_144], top_k=1024)
    dev = [cp.asarray(a) for a in p.arrays()]
    out = (cp.empty((1, 1024), cp.int32), cp.empty((1, 1024), cp.float32))
    ws = indexer.Workspace()
    eager = indexer.prepare(*dev, 1024, return_scores=True, workspace=ws, validate=False, graphs=False)
    forms = {
        "score_topk": lambda: indexer.score_topk(*dev, 1024, return_scores=True, out=out, workspace=ws,
                                                 validate=False),
        "prepared eager": lambda: eager(*dev, out=out),
    }
    for name, fn in forms.items():
        for _ in range(3):
            fn()
        print(f"{name}: {host_us(fn):.1f} us")
    for name, fn in forms.items():
        prof = cProfile.Profile()
        prof.enable()
        for i in range(2000):
            fn()
            if i % 10 == 0:
                cp.cuda.Device().synchronize()
        prof.disable()
        cp.cuda.Device().synchronize()
        print(f"==== {name}")
        pstats.Stats(prof).sort_stats("tottime").print_stats(35)


if __name__ == "__main__":
    main()
