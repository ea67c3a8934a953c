"""Where a GPU pool's append_many spends its host time: 200 steps of B sequences, one key
each, under cProfile (own time by function), and the step's parts timed one by one.

    PYTHONPATH=. python exp/append_profile.py [--batch 64]
"""

import argparse
import cProfile
import pstats
import time

import cupy as cp
import numpy as np

from indexer import KeyPool, keywrite


def per_call_us(fn, n=200):
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    B, D, E = args.batch, 128, 64
    rng = np.random.default_rng(0)
    pool = KeyPool(8192, entries_per_block=E, head_dim=D, device="cuda")
    seqs = list(range(B))
    keys = cp.asarray(rng.standard_normal((B, D), dtype=np.float32))
    pool.append_many(seqs, keys)
    items = [v for i, s in enumerate(seqs) for v in (pool._blocks[s][-1], 1, i, 1)]
    parts = {
        "append_many": lambda: pool.append_many(seqs, keys),
        "append_many(validate=False)": lambda: pool.append_many(seqs, keys, validate=False),
        "_as_keys (the check's read-back)": lambda: pool._as_keys(keys),
        "float(max(abs(keys)))": lambda: float(cp.max(cp.abs(keys))),
        "items to the device (cp.asarray)": lambda: cp.asarray(np.array(items, dtype=np.int32)),
        "write_blocks (copy + launch)": lambda: keywrite.write_blocks(pool.keys_fp4, pool.key_scale, pool.key_gscale,
                                                                     items, keys),
        "an empty kernel launch (cp.abs of 1)": lambda: cp.abs(keys[:1]),
    }
    for name, fn in parts.items():
        print(f"{name:40s} {per_call_us(fn):8.1f} us a call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        pool.append_many(seqs, keys)
    cp.cuda.Device().synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
