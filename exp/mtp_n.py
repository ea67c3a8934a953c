"""Multi-token decode with 1 to 5 query rows a request (B = 64, 65,536 entries, k = 1,024),
grouped by ``cu_seqlens`` as ``score_topk_ragged`` takes them (one row a request too): the
default path against the rows scored one by one (``fast-single``), whole calls and scoring
alone, graph replays timed as bench.py times them; the floor from the same run's ceilings.

    PYTHONPATH=. python exp/mtp_n.py [--rows 1,2,3,4,5] [--json FILE]
"""

import json
import sys

from indexer import bench


def main():
    rows = [int(n) for n in (sys.argv[sys.argv.index("--rows") + 1] if "--rows" in sys.argv else "1,2,3,4,5").split(",")]
    json_path = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    mods = bench._gpu_modules()
    cp = mods[0]
    bw, rate = bench.ceilings(cp)
    print(f"# {bench.device_name(cp)}  copy {bw / 1e12:.2f} TB/s  fp16 tensor {rate / 1e12:.0f} TFLOP/s")
    out = []
    for i, n in enumerate(rows):
        case = bench.Case(f"mtp-{n}", f"{n} rows a request", 64, n, 1024, kind="mtp", entries=65_536)
        sets, counts = bench.input_sets(case, cp, i)
        for x in sets:  # one row a request still goes as a grouped call
            x.setdefault("cu_seqlens", cp.arange(0, counts["T"] + 1, n, dtype=cp.int32))
        floor_ms = bench.floor_seconds(counts, bw, rate) * 1e3
        for path in ("fast", "fast-score", "fast-single", "fast-single-score"):
            ms, _, graph_ms = bench.measure(path, case, counts, sets, mods, 20, echo=print)
            print(f"{case.name:8s} {path:18s} eager {ms:8.4f}  graph {graph_ms:8.4f} ms  "
                  f"{graph_ms / floor_ms:5.2f} x floor ({floor_ms:.4f})")
            out.append(dict(case=case.name, path=path, ms=ms, graph_ms=graph_ms, floor_ms=floor_ms))
        del sets
        bench.free_device_memory(cp)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
