"""Decode at small and middling batches: B requests of one query row each over the same
number of entries (k = 1,024 unless given), the default path against each single-query
scoring kernel forced (the warp-specialised kernel and the wgmma kernel; geometry.ws_preferred
says which the default takes: one row only until v104, a few long rows since), whole calls
and scoring alone, graph replays timed as bench.py times them, each shape's paths in the
order given (a shape's first path tends to read a few per cent slower: compare forced
kernels with each other); the floor from the same run's ceilings.

    PYTHONPATH=. python exp/batch_sweep.py [--batches 1,2,4,8,16,32,64] [--entries 262144] [--E 64] [--k 1024]
                                           [--paths fast,fast-score,fast-ws,fast-ws-score,fast-wgmma,fast-wgmma-score] [--json FILE]
"""

import json
import sys


def _arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    from indexer import bench

    batches = [int(n) for n in _arg("--batches", "1,2,4,8,16,32,64").split(",")]
    entries = int(_arg("--entries", "262144"))
    E = int(_arg("--E", "64"))
    top_k = int(_arg("--k", "1024"))
    paths = _arg("--paths", "fast,fast-score,fast-ws,fast-ws-score,fast-wgmma,fast-wgmma-score").split(",")
    json_path = _arg("--json", None)
    mods = bench._gpu_modules()
    cp = mods[0]
    bw, rate = bench.ceilings(cp)
    print(f"# {bench.device_name(cp)}  copy {bw / 1e12:.2f} TB/s  fp16 tensor {rate / 1e12:.0f} TFLOP/s  "
          f"entries {entries}  E {E}  k {top_k}")
    out = []
    for i, b in enumerate(batches):
        case = bench.Case(f"B{b}", f"{b} requests", b, 1, top_k, E=E, entries=entries)
        sets, counts = bench.input_sets(case, cp, i)
        floor_ms = bench.floor_seconds(counts, bw, rate) * 1e3
        for path in paths:
            ms, _, graph_ms = bench.measure(path, case, counts, sets, mods, 20, echo=lambda *a, **k: None)
            print(f"B={b:3d} {path:18s} eager {ms:8.4f}  graph {graph_ms:8.4f} ms  "
                  f"{graph_ms / floor_ms:5.2f} x floor ({floor_ms:.4f})", flush=True)
            out.append(dict(batch=b, entries=entries, E=E, top_k=top_k, path=path, ms=ms, graph_ms=graph_ms, floor_ms=floor_ms))
        del sets
        bench.free_device_memory(cp)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
