"""Where a prepared call's graph replay spends its host time (batch 1, 262,144 entries,
k 1024, CuPy arrays, out= given): the whole replay's median host time, the graph launch
alone, then cProfile's busiest functions over 3,000 replays.

    PYTHONPATH=. python exp/replay_profile.py
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
        if len(times) % 20 == 0:
            cp.cuda.Device().synchronize()
    cp.cuda.Device().synchronize()
    return float(np.median(times) * 1e6)


def main():
    p = testing.random_problem(np.random.default_rng(0), T=1, H=64, D=128, E=64, lens=[262_144], top_k=1024)
    dev = [cp.asarray(a) for a in p.arrays()]
    out = (cp.empty((1, 1024), cp.int32), cp.empty((1, 1024), cp.float32))
    ws = indexer.Workspace()
    step = indexer.prepare(*dev, 1024, return_scores=True, workspace=ws, validate=False)
    for _ in range(3):
        step(*dev, out=out)
    cp.cuda.Device().synchronize()
    graph = next(iter(step._graphs.values()))[0]
    stream = cp.cuda.get_current_stream()
    for _ in range(3):
        print(f"replay {host_us(lambda: step(*dev, out=out)):6.1f} us   graph.launch alone "
              f"{host_us(lambda: graph.launch(stream)):6.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for i in range(3000):
        step(*dev, out=out)
        if i % 20 == 0:
            cp.cuda.Device().synchronize()
    prof.disable()
    cp.cuda.Device().synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
