"""Host time of Workspace.turn: eager calls at batch 1 (262,144 entries, H 64, D 128, k 1024)
with the turn on and switched off, alternating in one process (this host's speed moves
between processes); median us of host time a call, 5 rounds of 200 calls each.

    PYTHONPATH=. python exp/turn_cost.py
"""

import contextlib
import time
import types

import cupy as cp
import numpy as np

import indexer
import indexer.workspace
from indexer import testing


# what a switched-off turn gives its `with ... as turn` (PreparedCall reads turn.capturing)
_NO_TURN = types.SimpleNamespace(capturing=None)

def host_us(fn, n=200):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) % 20 == 0:
            cp.cuda.Device().synchronize()  # keep the queue short: host time, not back-pressure
    cp.cuda.Device().synchronize()
    return np.median(times) * 1e6


def main():
    p = testing.random_problem(np.random.default_rng(0), T=1, H=64, D=128, E=64, lens=[262_144], top_k=1024)
    dev = [cp.asarray(a) for a in p.arrays()]
    out = (cp.empty((1, 1024), cp.int32), cp.empty((1, 1024), cp.float32))
    ws = indexer.Workspace()
    step = indexer.prepare(*dev, 1024, return_scores=True, workspace=ws, validate=False, graphs=False)
    forms = {"prepared (eager)": lambda: step(*dev, out=out),
             "score_topk validate=False": lambda: indexer.score_topk(*dev, 1024, return_scores=True, out=out,
                                                                     workspace=ws, validate=False)}
    on = indexer.workspace.Workspace.turn
    off = lambda self: contextlib.nullcontext(_NO_TURN)  # noqa: E731
    for fn in forms.values():
        fn()
    cp.cuda.Device().synchronize()
    for name, fn in forms.items():
        rows = {"on": [], "off": []}
        for _ in range(5):
            for label, turn in (("on", on), ("off", off)):
                indexer.workspace.Workspace.turn = turn
                rows[label].append(host_us(fn))
        indexer.workspace.Workspace.turn = on
        print(f"{name:28s} turn on {np.median(rows['on']):7.1f} us  off {np.median(rows['off']):7.1f} us  "
              f"(rounds on {' '.join(f'{x:.1f}' for x in rows['on'])}; off {' '.join(f'{x:.1f}' for x in rows['off'])})")


if __name__ == "__main__":
    main()
