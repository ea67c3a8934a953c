"""A prepared call's graph replay, step by step (batch 1, 262,144 entries, k 1024, CuPy
arrays, out= given): each step of PreparedCall's replay path timed alone in a loop (median
us of 20 rounds of 2,000), then the whole replay, an eager prepared call and a
score_topk call (median host us a call), three times.

    PYTHONPATH=. python exp/replay_parts.py
"""

import cupy as cp

import indexer
from indexer import streams
from host_timing import batch1, eager_forms, host_us, per_call_us, replaying


def main():
    from indexer import cuda_ops

    dev, out = batch1()
    ws = indexer.Workspace()
    step, graph = replaying(dev, out, ws)
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
    print(f"{'graph.launch':36s} {host_us(lambda: graph.launch(cur), n=300):6.2f} us")
    cp.cuda.Device().synchronize()
    forms = eager_forms(dev, out, ws)
    for _ in range(3):
        print(f"whole replay {host_us(lambda: step(*dev, out=out), n=300):6.1f} us   prepared eager "
              f"{host_us(forms['prepared eager'], n=300):6.1f} us   score_topk {host_us(forms['score_topk'], n=300):6.1f} us")


if __name__ == "__main__":
    main()
