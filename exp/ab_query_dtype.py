"""Interleaved one-process A/B of the default kernels on a float32 query and on the same
query in float16, for bench cases: graph replays timed as bench.py times them, the two
dtypes alternating for several rounds so that drift falls on both alike.

    PYTHONPATH=. python exp/ab_query_dtype.py [--cases prefill-chunk,decode-1M] [--rounds 4]
"""

import argparse
import statistics

from indexer import Workspace, arrays, bench, cuda_ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="prefill-chunk,decode-1M,prefill-8K")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    cp = arrays.cupy()
    for case in bench.select_cases(args.cases):
        sets, _ = bench.input_sets(case, cp, 0)
        forms = {"float32": sets, "float16": [dict(x, q=x["q"].astype(cp.float16)) for x in sets]}
        ws = Workspace()

        def fn(x):
            return bench.call_case(cuda_ops, x, case.top_k, validate=False, workspace=ws)

        times = {name: [] for name in forms}
        for _ in range(args.rounds):
            for name, s in forms.items():
                times[name].append(bench.time_graph(cp, fn, s))
        a, b = (statistics.median(times[n]) for n in forms)
        print(f"{case.name:15s} float32 {a:.4f} ms  float16 {b:.4f} ms  ({(b / a - 1) * 100:+.2f}%)  "
              f"rounds: {[round(t, 4) for t in times['float32']]} / {[round(t, 4) for t in times['float16']]}")
        del sets, forms
        bench.free_device_memory(cp)


if __name__ == "__main__":
    main()
