"""Host time of Workspace.turn: eager calls at batch 1 (262,144 entries, H 64, D 128, k 1024)
with the turn on and switched off, alternating in one process (this host's speed moves
between processes); median us of host time a call, 5 rounds of 200 calls each.

    PYTHONPATH=. python exp/turn_cost.py
"""

import contextlib
import types

import cupy as cp
import numpy as np

import indexer
import indexer.workspace
from host_timing import batch1, host_us


# what a switched-off turn gives its `with ... as turn` (PreparedCall reads turn.capturing)
_NO_TURN = types.SimpleNamespace(capturing=None)


def main():
    dev, out = batch1()
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
