"""A prepared call's graph replay, step by step (batch 1, 262,144 entries, k 1024, CuPy
arrays, out= given): each step of PreparedCall's replay path timed alone in a loop (median
us of 15 rounds of 2,000), then the whole replay, an eager prepared call and a score_topk call (median host us a
call), three times.

    PYTHONPATH=. python exp/replay_parts.py
"""

import time

import cupy as cp
import numpy as np

import indexer
from indexer import streams, testing


def per_call_us(fn, n=2000, rounds=15):
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return float(np.median(out))


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
    from indexer import cuda_ops

    p = testing.random_problem(np.random.default_rng(0), T=1, H=64, D=128, E=64, lens=[262_144], top_k=1024)
    dev = tuple(cp.asarray(a) for a in p.arrays())
    out = (cp.empty((1, 1024), cp.int32), cp.empty((1, 1024), cp.float32))
    ws = indexer.Workspace()
    step = indexer.prepare(*dev, 1024, return_scores=True, workspace=ws, validate=False)
    for _ in range(3):
        step(*dev, out=out)
    cp.cuda.Device().synchronize()
    graph = next(iter(step._graphs.values()))[0]
    cur = cp.cuda.get_current_stream()

    def using_empty():
        with streams.using(None, dev):
            pass

    def turn_empty():
        with ws.turn():
            pass

    def key():
        return tuple(x.data.ptr for x in dev) + step._out_pointers(out)

    parts = {
        "_match(given)": lambda: step._match(dev),
        "_out_pointers(out)": lambda: step._out_pointers(out),
        "pointer key (inputs + out)": key,
        "with streams.using(None, given)": using_empty,
        "with ws.turn()": turn_empty,
        "on_torch_stream(given)": lambda: streams.on_torch_stream(dev),
        "get_current_stream()": cp.cuda.get_current_stream,
        "plan_alignment": lambda: cuda_ops.plan_alignment(dev[0].data.ptr, dev[3].data.ptr),
        "ws.at_rest(device)": lambda: ws.at_rest(0),
        "stream.is_capturing()": cur.is_capturing,
        "with cp.cuda.Device(0)": None,
    }
    for name, fn in parts.items():
        if name.startswith("with cp.cuda.Device"):
            d = cp.cuda.Device(0)

            def fn(d=d):
                with d:
                    pass
        print(f"{name:36s} {per_call_us(fn):6.2f} us")
    print(f"{'graph.launch':36s} {host_us(lambda: graph.launch(cur)):6.2f} us")
    cp.cuda.Device().synchronize()
    eager = indexer.prepare(*dev, 1024, return_scores=True, workspace=ws, validate=False, graphs=False)

    def plain():
        return indexer.score_topk(*dev, 1024, return_scores=True, out=out, workspace=ws, validate=False)

    for _ in range(3):
        print(f"whole replay {host_us(lambda: step(*dev, out=out)):6.1f} us   prepared eager "
              f"{host_us(lambda: eager(*dev, out=out)):6.1f} us   score_topk {host_us(plain):6.1f} us")


if __name__ == "__main__":
    main()
