#!/usr/bin/env python3
"""Four calls of one benchmark case on the GPU, for scripts/kernel_times.sh to profile the
last one (per-kernel device times).

    python scripts/kernel_times.py decode-latency
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer import bench, cuda_ops  # noqa: E402


def main(name: str) -> None:
    cp = bench.require_gpu()
    case = bench.select_cases(name)[0]
    sets, _ = bench.input_sets(case, cp, 0)
    x = sets[0]
    for _ in range(4):
        bench.call_case(cuda_ops, x, case.top_k, validate=False)
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
