"""Host time of an eager ``write_keys`` (64 keys of 128 into 4,096 blocks of 64), this
checkout's against a base copy of the package imported under another name (``indexer_base``:
`mkdir -p exp/_base && git archive <base> indexer kernels | tar -x -C exp/_base && mv
exp/_base/indexer exp/_base/indexer_base`), in one process, the two alternating round by
round (a host's noise moves both alike). Median us of each form over the rounds.

    PYTHONPATH=.:exp/_base python exp/write_keys_ab.py [--rounds 12]
"""

import argparse
import statistics

import indexer_base
import torch

import indexer
from host_timing import host_us, key_write_forms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    rounds = ap.parse_args().rounds
    forms = key_write_forms(torch)
    times = {(name, which): [] for name in forms for which in ("base", "new")}
    for r in range(rounds):
        for name, (k, s, p, check) in forms.items():
            for which, mod in (("base", indexer_base), ("new", indexer)) if r % 2 else (("new", indexer),
                                                                                          ("base", indexer_base)):
                def fn(mod=mod, k=k, s=s, p=p, check=check):
                    mod.write_keys(k, s, *p, validate=check)
                if r == 0:
                    for _ in range(5):
                        fn()
                times[(name, which)].append(host_us(fn, n=200, sync_every=10))
    print(f"median host us over {rounds} alternating rounds (base / new, change)")
    for name in forms:
        b, n = (statistics.median(times[(name, w)]) for w in ("base", "new"))
        print(f"  {name:22s} {b:7.1f} / {n:7.1f}  {100 * (n / b - 1):+6.1f}%")


if __name__ == "__main__":
    main()
