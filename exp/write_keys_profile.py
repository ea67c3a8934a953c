"""Where an eager ``write_keys`` spends its host time: a decode step's 64 keys (float32 and
bfloat16) into a pool of 4,096 blocks of 64 entries, unchecked and checked, from CuPy
arrays and from PyTorch tensors on PyTorch's current stream. Each form's median host time
(``host_us``: queue kept short, synchronisations not timed), then cProfile's busiest
functions for the PyTorch forms.

    PYTHONPATH=. python exp/write_keys_profile.py [--no-profile]
"""

import sys

import torch

import indexer
from host_timing import host_us, key_write_forms, profile


def main():
    forms = {name: (lambda k=k, s=s, p=p, check=check: indexer.write_keys(k, s, *p, validate=check))
             for name, (k, s, p, check) in key_write_forms(torch).items()}
    for fn in forms.values():
        for _ in range(5):
            fn()
    for _ in range(2):
        print("  ".join(f"{name}: {host_us(fn, n=400, sync_every=10):6.1f} us" for name, fn in forms.items()))
    if "--no-profile" in sys.argv[1:]:
        return
    for name in ("torch f32 unchecked", "torch f32 checked"):
        print(f"==== {name}")
        profile(forms[name], 2000, 10, 30)


if __name__ == "__main__":
    main()
