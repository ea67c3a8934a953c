"""What the PyTorch operators' argument checks before dispatch (torch_ops._check_arguments)
cost an eager batch-1 call: one process, the checks and a no-op alternating, median host us.

    PYTHONPATH=. python exp/op_check_cost.py
"""

import torch

import indexer.torch_ops as iops
from host_timing import batch1, host_us


def main():
    dev, out = batch1(torch)
    real = iops._check_arguments
    forms = {"iops.score_topk": lambda: iops.score_topk(*dev, 1024),
             "iops.score_topk (out=)": lambda: iops.score_topk(*dev, 1024, out=out)}
    for fn in forms.values():
        for _ in range(5):
            fn()
    times = {(name, kind): [] for name in forms for kind in ("checks", "none")}
    for _ in range(6):
        for kind, check in (("checks", real), ("none", lambda *a: None)):
            iops._check_arguments = check
            for name, fn in forms.items():
                times[name, kind].append(host_us(fn, n=200, sync_every=10))
    iops._check_arguments = real
    for (name, kind), t in times.items():
        t.sort()
        print(f"  {name:26s} {kind:7s} median {t[len(t) // 2]:6.1f} us  (min {t[0]:.1f})")


if __name__ == "__main__":
    main()
