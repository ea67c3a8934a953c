"""Where an eager ``write_keys`` spends its host time: a decode step's 64 keys (float32 and
bfloat16) into a pool of 4,096 blocks of 64 entries, unchecked and checked, from CuPy
arrays and from PyTorch tensors on PyTorch's current stream. Each form's median host time
(``host_us``: queue kept short, synchronisations not timed), then cProfile's busiest
functions for the PyTorch forms.

    PYTHONPATH=. python exp/write_keys_profile.py [--no-profile]
"""

import sys

import cupy as cp
import numpy as np
import torch

import indexer
from host_timing import host_us, profile

B, D, E, P = 64, 128, 64, 4096


def main():
    rng = np.random.default_rng(0)
    pool = (cp.zeros((P, E, D // 2), cp.uint8), cp.zeros((P, E, D // 16), cp.uint8), cp.ones(P, cp.float32))
    keys = cp.asarray(rng.standard_normal((B, D), dtype=np.float32))
    slots = cp.arange(B, dtype=cp.int64) * E + 5
    cp.cuda.Device().synchronize()
    t_pool = [torch.from_dlpack(a) for a in pool]
    t_keys, t_slots = torch.from_dlpack(keys), torch.from_dlpack(slots)
    t_bf16 = t_keys.to(torch.bfloat16)
    torch.cuda.synchronize()
    forms = {
        "cupy f32 unchecked": lambda: indexer.write_keys(keys, slots, *pool, validate=False),
        "cupy f32 checked": lambda: indexer.write_keys(keys, slots, *pool, validate=True),
        "torch f32 unchecked": lambda: indexer.write_keys(t_keys, t_slots, *t_pool, validate=False),
        "torch bf16 unchecked": lambda: indexer.write_keys(t_bf16, t_slots, *t_pool, validate=False),
        "torch f32 checked": lambda: indexer.write_keys(t_keys, t_slots, *t_pool, validate=True),
    }
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
