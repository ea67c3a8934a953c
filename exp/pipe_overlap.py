"""Which CUDA-core instruction classes slow the tensor cores' MMAs when they run beside them
(exp/pipe_overlap.cu), one class at a time, two CTAs an SM of one MMA warpgroup and one
class warpgroup each.

For each class: the MMA role alone, the class alone (its rounds scaled so that it takes as
many cycles as the MMAs alone), then both at once; each role's SM cycles (the mean over
CTAs) and the clock. Independent pipes show each role's cycles unchanged side by side; a
shared resource shows both slowed, the sum of their shares ("kept") falling from 2 to 1.

    PYTHONPATH=. python exp/pipe_overlap.py [--rounds 4000]
"""

import argparse
from pathlib import Path

import cupy as cp
import numpy as np

from indexer import _jit

CLASSES = ["FFMA", "LOP3", "F2FP e4m3x2", "HFMA2", "IMAD", "SHF", "FMNMX", "LDS.128", "FADD |x|", "decode word",
           "x+|x|, FFMA", "FMNMX, FFMA"]  # the last two: the single-query epilogue's (head, entry) pair, two forms
SS_CLASSES = (0, 1, 2, 9)  # also against MMAs with A from shared memory


def build():
    path = Path(__file__).resolve().parent / "pipe_overlap.cu"
    names = [f"pipe_overlap_kernel<{c}, {r}, {'true' if ss else 'false'}>"
             for c in range(len(CLASSES)) for r in (1, 2, 3) for ss in (False, True)]
    cc = int(cp.cuda.Device().compute_capability)
    mod = cp.RawModule(code=_jit._inline(path, {path}), options=_jit.compile_options(cc), name_expressions=names)
    return {n: mod.get_function(n) for n in names}


def overlap_share(c, role):
    """How much of an SM's CTAs' spans of ``role`` (0: MMA, 1: the class) ran at the same time,
    from a launch's clk words (grid, 8): the mean over SMs of (the spans' intersection / their
    union); 1 = side by side, 0 = one after the other."""
    start, span, sm = c[:, 4 + role], c[:, 2 + role], c[:, 6]
    shares = []
    for s in np.unique(sm):
        on = np.flatnonzero(sm == s)
        if len(on) < 2:
            shares.append(0.0)
            continue
        first, last = start[on], start[on] + span[on]
        shares.append(max(0, last.min() - first.max()) / max(last.max() - first.min(), 1))
    return float(np.mean(shares))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4000)
    args = ap.parse_args()
    kernels = build()
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    grid = 2 * sms
    rng = cp.random.default_rng(5)
    a = rng.standard_normal(8 * 4 * 128, dtype=cp.float32).astype(cp.float16).view(cp.uint32)
    b = rng.standard_normal(16 * 1024 // 2, dtype=cp.float32).astype(cp.float16)
    out = cp.empty(grid * 256, dtype=cp.float32)
    clk = cp.zeros(grid * 8, dtype=cp.int64)
    smem = 16 * 1024

    def run(cls, roles, ss, mma_rounds, class_rounds):
        k = kernels[f"pipe_overlap_kernel<{cls}, {roles}, {'true' if ss else 'false'}>"]
        for _ in range(2):  # the second launch is the one read
            clk.fill(0)
            k((grid,), (256,), (a, b, np.int32(mma_rounds), np.int32(class_rounds), out, clk), shared_mem=smem)
        cp.cuda.Device().synchronize()
        c = cp.asnumpy(clk).reshape(grid, 8)
        mma_cyc, cls_cyc = c[:, 0].mean(), c[:, 1].mean()
        mhz = 1e3 * (c[:, 0].sum() + c[:, 1].sum()) / max(c[:, 2].sum() + c[:, 3].sum(), 1)
        return mma_cyc, cls_cyc, mhz, overlap_share(c, 0 if roles & 1 else 1)

    R = args.rounds
    flops_round = 2 * 8 * 2 * 64 * 64 * 16  # a round: two sub-tiles of 8 k-steps, a warpgroup
    for ss in (False, True):
        mma_alone, _, mhz_m, mma_overlap = run(0, 1, ss, R, 0)
        rate = flops_round * R * 2 * sms / (mma_alone / (mhz_m * 1e6))  # FLOP/s at that clock
        print(f"MMA alone ({'A from shared memory' if ss else 'A from registers'}): {mma_alone:,.0f} cycles for "
              f"{R} rounds, {mma_alone / R:.1f} cycles a round (2 CTAs an SM), {mhz_m:.0f} MHz, "
              f"{rate / 1e12:.0f} TFLOP/s if an SM's two CTAs ran side by side; they overlapped {mma_overlap:.2f} "
              f"of their spans (1: side by side, 0: one after the other)")
        print(f"{'class':<13} {'lanes/cyc/SM':>12} {'alone cyc':>10} {'MMA with':>9} {'class with':>10} "
              f"{'MMA kept':>8} {'cls kept':>8} {'sum':>5} {'MHz':>5} {'CTAs':>5}")
        for cls, name in enumerate(CLASSES):
            if ss and cls not in SS_CLASSES:
                continue
            _, probe, _, _ = run(cls, 2, ss, 0, R)
            rounds = max(1, int(round(R * mma_alone / max(probe, 1))))
            _, alone, _, _ = run(cls, 2, ss, 0, rounds)
            m_with, c_with, mhz, side_by_side = run(cls, 3, ss, R, rounds)
            # instructions a round (decode: ~15 a word; an epilogue pair: 2)
            ops = {7: 4, 9: 4 * 15, 10: 32, 11: 32}.get(cls, 16)
            lanes = ops * 128 * 2 * rounds / alone  # thread-instructions a cycle an SM
            kept_m, kept_c = mma_alone / m_with, alone / c_with
            print(f"{name:<13} {lanes:12.1f} {alone:10,.0f} {m_with:9,.0f} {c_with:10,.0f} "
                  f"{kept_m:8.2f} {kept_c:8.2f} {kept_m + kept_c:5.2f} {mhz:5.0f} {side_by_side:5.2f}")


if __name__ == "__main__":
    main()
