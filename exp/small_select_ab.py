"""One-process A/B of a rule in indexer.geometry on small-batch decode (B requests of one
row over the same length): whole calls in graphs, the variants alternated round after
round, with whether each variant's answers are the defaults' bit for bit.

    PYTHONPATH=. python exp/small_select_ab.py --batches 2,3,4,6,8 --entries 262144 \
        --variant RANK_ALL_PAIRS_WORK=1 --variant RANK_ALL_PAIRS_WORK=16384 [--k 1024] [--rounds 4]
"""

import argparse
import ast
import statistics


def main():
    from indexer import Workspace, bench, cuda_ops, geometry

    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="2,3,4,6,8")
    ap.add_argument("--entries", type=int, default=262144)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--variant", action="append", required=True, help="NAME=VALUE of indexer.geometry")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    variants = {"defaults": {}}
    for spec in args.variant:
        name, _, value = spec.partition("=")
        assert hasattr(geometry, name), name
        variants[spec] = {name: ast.literal_eval(value)}
    defaults = {n: getattr(geometry, n) for v in variants.values() for n in v}
    cp = bench.require_gpu()
    for i, b in enumerate(int(x) for x in args.batches.split(",")):
        case = bench.Case(f"B{b}", "", b, 1, args.k, entries=args.entries)
        sets, _ = bench.input_sets(case, cp, i)
        times, answers = {}, {}
        try:
            for r in range(args.rounds):
                for label, settings in variants.items():
                    for n, v in {**defaults, **settings}.items():
                        setattr(geometry, n, v)
                    cuda_ops.clear_plans()
                    ws = Workspace()

                    def call(x, ws=ws, scores=False):
                        return bench.call_case(cuda_ops, x, case.top_k, validate=False, workspace=ws,
                                               return_scores=scores)

                    if r == 0:
                        answers[label] = [a.get() for a in call(sets[0], scores=True)]
                    times.setdefault(label, []).append(bench.time_graph(cp, call, sets, repeats=20,
                                                                        echo=lambda *a: None))
        finally:
            for n, v in defaults.items():
                setattr(geometry, n, v)
            cuda_ops.clear_plans()
        for label, ts in times.items():
            same = "" if label == "defaults" else (
                "  bits equal" if all(a.tobytes() == d.tobytes() for a, d in zip(answers[label], answers["defaults"]))
                else "  ANSWERS DIFFER")
            print(f"B={b:3d} x {args.entries}  {label:>28s}  median {statistics.median(ts) * 1e3:7.2f} us  "
                  + " ".join(f"{t * 1e3:.2f}" for t in ts) + same, flush=True)
        del sets
        bench.free_device_memory(cp)


if __name__ == "__main__":
    main()
