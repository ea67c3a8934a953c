"""Host time of the PyTorch operators' eager calls at batch 1 (262,144 entries, top-1024),
beside the public ``score_topk`` on the same tensors (out= and a workspace) as this
process's yardstick: run it from two checkouts in alternating processes and compare the
operators' times, and their ratios to the yardstick.

    PYTHONPATH=. python exp/torch_op_host.py
"""

import torch

import indexer
import indexer.torch_ops as iops
from host_timing import batch1, host_us


def main():
    dev, out = batch1(torch)
    ws = indexer.Workspace()
    forms = {
        "score_topk (out=, workspace)": lambda: indexer.score_topk(*dev, 1024, return_scores=True, out=out,
                                                                   workspace=ws, validate=False),
        "iops.score_topk": lambda: iops.score_topk(*dev, 1024),
        "iops.score_topk (out=)": lambda: iops.score_topk(*dev, 1024, out=out),
    }
    for fn in forms.values():
        for _ in range(5):
            fn()
    times = {name: [host_us(fn, n=300, sync_every=10) for _ in range(3)] for name, fn in forms.items()}
    base = min(times["score_topk (out=, workspace)"])
    for name, t in times.items():
        print(f"  {name:30s} {min(t):7.1f} us  ({min(t) / base:.2f} x score_topk)")


if __name__ == "__main__":
    main()
