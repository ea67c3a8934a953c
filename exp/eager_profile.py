"""Where an eager call spends its host time (batch 1, 262,144 entries, k 1024, CuPy arrays
or with --torch PyTorch tensors, out= and a workspace given, validate=False): score_topk and
a prepared call without graphs (and with --torch the PyTorch operator), each its median host
time, then cProfile's busiest functions over 2,000 calls.

    PYTHONPATH=. python exp/eager_profile.py [--torch]
"""

import sys

import indexer
from host_timing import batch1, eager_forms, host_us, profile


def main():
    torch = None
    if "--torch" in sys.argv[1:]:
        import torch
    dev, out = batch1(torch)
    forms = eager_forms(dev, out, indexer.Workspace())
    for name, fn in forms.items():
        for _ in range(3):
            fn()
        print(f"{name}: {host_us(fn, n=300, sync_every=10):.1f} us")
    for name, fn in forms.items():
        print(f"==== {name}")
        profile(fn, 2000, 10, 35)


if __name__ == "__main__":
    main()
