"""Where Workspace.turn's host time goes: each host step it takes, timed alone in a loop
(median us of 20 rounds of 2,000), the whole empty turn, and a prepared batch-1 call's
graph replay (262,144 entries, k 1024) with the turn on and off, alternating in one process.

    PYTHONPATH=. python exp/turn_parts.py
"""

import contextlib
import threading
import types

import cupy as cp
import numpy as np

import indexer
import indexer.workspace
from indexer import arrays, streams
from host_timing import batch1, host_us, per_call_us


# what a switched-off turn gives its `with ... as turn` (PreparedCall reads turn.capturing)
_NO_TURN = types.SimpleNamespace(capturing=None)


def main():
    s = cp.cuda.Stream(non_blocking=True)
    ev = cp.cuda.Event(disable_timing=True)
    lock = threading.RLock()
    ws = indexer.Workspace()
    cur = cp.cuda.get_current_stream()

    def lock_pair():
        lock.acquire()
        lock.release()

    parts = {
        "RLock acquire+release": lock_pair,
        "arrays.cupy()": arrays.cupy,
        "cp.cuda.get_current_stream()": cp.cuda.get_current_stream,
        "streams.capture_state(stream)": lambda: streams.capture_state(cur),
        "stream.is_capturing()": cur.is_capturing,
        "runtime.getDevice()": cp.cuda.runtime.getDevice,
        "cp.cuda.Device().id": lambda: cp.cuda.Device().id,
        "runtime.eventRecord": lambda: cp.cuda.runtime.eventRecord(ev.ptr, cur.ptr),
        "runtime.streamWaitEvent": lambda: cp.cuda.runtime.streamWaitEvent(cur.ptr, ev.ptr, 0),
        "_stream_key(stream)": lambda: indexer.workspace._stream_key(cur),
        "threading.get_ident()": threading.get_ident,
    }

    def empty_turn():
        with ws.turn():
            pass

    parts["with ws.turn(): pass (same stream)"] = empty_turn

    def other_stream_turns():
        with ws.turn():
            pass
        with s:
            with ws.turn():
                pass

    for name, fn in parts.items():
        print(f"{name:40s} {per_call_us(fn):6.2f} us")
    print(f"{'two turns, alternating streams (/2)':40s} {per_call_us(other_stream_turns, n=1000) / 2:6.2f} us")
    cp.cuda.Device().synchronize()

    dev, out = batch1()
    step = indexer.prepare(*dev, 1024, return_scores=True, workspace=ws, validate=False)
    for _ in range(3):
        step(*dev, out=out)
    cp.cuda.Device().synchronize()
    on = indexer.workspace.Workspace.turn
    off = lambda self: contextlib.nullcontext(_NO_TURN)  # noqa: E731
    rows = {"on": [], "off": []}
    for _ in range(7):
        for label, turn in (("on", on), ("off", off)):
            indexer.workspace.Workspace.turn = turn
            rows[label].append(host_us(lambda: step(*dev, out=out)))
    indexer.workspace.Workspace.turn = on
    print(f"prepared replay (graph)   turn on {np.median(rows['on']):6.1f} us  off {np.median(rows['off']):6.1f} us  "
          f"(on {' '.join(f'{x:.1f}' for x in rows['on'])}; off {' '.join(f'{x:.1f}' for x in rows['off'])})")


if __name__ == "__main__":
    main()
