"""The eager path's dtype names and contiguity flags, A/B in one process: batch-1 eager calls
(score_topk and a prepared call without graphs; 262,144 entries, k 1024, out= and a
workspace) with arrays.dtype_name / arrays.c_contiguous as they are, and as they were
(str of the dtype each time; x.flags), alternating; median host us of 7 rounds each.

    PYTHONPATH=. python exp/eager_ab.py
"""

import time

import cupy as cp
import numpy as np

import indexer
from indexer import arrays, testing


def host_us(fn, n=200):
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
    now = (arrays.dtype_name, arrays.c_contiguous)
    before = (lambda x: str(x.dtype).rpartition(".")[2], lambda x: bool(x.flags.c_contiguous))
    for name, fn in forms.items():
        fn()
        rows = {"now": [], "before": []}
        for _ in range(7):
            for label, (names, contiguous) in (("now", now), ("before", before)):
                arrays.dtype_name, arrays.c_contiguous = names, contiguous
                rows[label].append(host_us(fn))
        arrays.dtype_name, arrays.c_contiguous = now
        print(f"{name:16s} now {np.median(rows['now']):6.1f} us  before {np.median(rows['before']):6.1f} us  "
              f"(now {' '.join(f'{x:.0f}' for x in rows['now'])}; before {' '.join(f'{x:.0f}' for x in rows['before'])})")


if __name__ == "__main__":
    main()
