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
        cuda_ops.score_topk(x["q"], x["w"], x["keys_fp4"], x["key_scale"], x["key_gscale"], x["block_table"],
                            x["valid_lens"], case.top_k, validate=False,
                            _cu_seqlens=x.get("cu_seqlens"))
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
