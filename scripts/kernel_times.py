#!/usr/bin/env python3
"""Four calls of one benchmark case on the GPU, for scripts/kernel_times.sh to profile the
last one (per-kernel device times).

    python scripts/kernel_times.py decode-latency
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer import bench  # noqa: E402


def main(name: str) -> None:
    try:
        case = bench.select_cases(name)[0]
    except ValueError as exc:  # an unknown case: one line
        raise SystemExit(f"kernel_times: {exc}") from None
    cp = bench.require_gpu()
    from indexer import cuda_ops  # noqa: PLC0415  (imports CuPy)

    sets, _ = bench.input_sets(case, cp, 0)
    x = sets[0]
    for _ in range(4):
        bench.call_case(cuda_ops, x, case.top_k, validate=False)
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) != 2:
        print("usage: python scripts/kernel_times.py CASE", file=sys.stderr)
        sys.exit(2)
    try:
        main(sys.argv[1])
    except bench.GPUUnavailable as exc:  # one line
        print(f"kernel_times: {exc}", file=sys.stderr)
        sys.exit(2)
