#!/usr/bin/env python3
"""What bounds the fp16 scoring kernels, measured in one run on the GPU.

    python scripts/probe_ceiling.py                      # decode-1M and decode-128K
    python scripts/probe_ceiling.py --cases decode-1M --rounds 8192

Beside bench's ceilings (copy bandwidth, an 8192^3 fp16 GEMM: what the floor is measured
against), it prints
  * the rate of the one MMA shape the scoring kernels issue, alone (wgmma.m64n64k16, A
    from registers, B from shared memory: kernels/probe_wgmma.cu), at 1, 2 and 3 CTAs of
    one warpgroup per SM (the single-warpgroup scoring kernel runs 3);
  * whether the tensor cores and the CUDA cores overlap: one tile's MMAs alone, its decode
    and epilogue arithmetic alone (no loads, stores or addresses), and both, in one
    warpgroup in the kernel's order and in two warpgroups side by side
    (wgmma_overlap_kernel); time per tile per SM near the sum of the parts says they
    serialise, near the larger part says they overlap; and the MMAs and epilogues alone,
    against key fragments decoded once (the keys-stationary loop order: what a tile
    costs each further query that shares it);
  * the scoring kernel's tile loop rebuilt on that core in steps (wgmma_tile_kernel: codes
    and scales from a shared-memory stage, then the kernel's epilogue), so that the real
    kernel's time per tile minus the last step is what its key stream costs, and the same
    loop in the keys-stationary order (the decode once, a query a round);
  * per case, the scoring alone (graph replay) on the case's inputs, and on the same inputs
    with every block id folded into a hot set of pool blocks that stays in L2: the same
    instruction stream with the key stream's memory time taken out.
A hot-pool time close to the real one says the kernel is bound by its own instructions,
not by memory; the MMA-alone rate says how close to the floor its MMAs could come at all.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer import bench  # noqa: E402

HOT_BLOCKS = 64  # 64 blocks x 64 entries x 72 bytes: ~300 KB of keys, resident in L2
MMA_FLOPS = 2 * 64 * 64 * 16  # one wgmma.m64n64k16


def fold_block_table(block_table, blocks: int = HOT_BLOCKS):
    """block_table with every block id b >= 0 replaced by b % blocks (-1 stays -1): NumPy
    or CuPy (T, L) int32 in, the same kind out."""
    return (block_table % blocks) * (block_table >= 0) - (block_table < 0)


def _sm_count(cp) -> int:  # gpu-only
    return cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"]


def _operands(cp, seed: int, with_a: bool = True):  # gpu-only
    """The probes' random fp16 operands: A fragments ([8][4][128] u32 of fp16 pairs, two sets;
    None without with_a) and B (64 x 128 fp16). Never time on zeros: the tensor cores' power,
    and so their clock, depends on the data."""
    rng = cp.random.default_rng(seed)
    a = rng.standard_normal(8 * 4 * 128 * 2, dtype=cp.float32).astype(cp.float16).view(cp.uint32) if with_a else None
    b = rng.standard_normal(16 * 1024 // 2, dtype=cp.float32).astype(cp.float16)
    return a, b


def _timed_with_clock(cp, launch, clk, rounds: int, ctas_per_sm: int) -> tuple[float, float]:  # gpu-only
    """(ns per round per SM, mean SM clock in MHz) of launch(), whose kernel writes each CTA's
    (clocks, nanoseconds) into clk."""
    ms = bench.time_it(cp, lambda _: launch(), [None], warmup=2, repeats=10)
    cycles, ns = (int(v) for v in cp.asnumpy(clk).reshape(-1, 2).sum(axis=0))
    return ms * 1e6 / (rounds * ctas_per_sm), 1e3 * cycles / max(ns, 1)


def wgmma_rate(cp, ctas_per_sm: int, rounds: int) -> float:  # gpu-only
    """FLOP/s of wgmma_rate_kernel<128> with ctas_per_sm one-warpgroup CTAs per SM."""
    from indexer import _jit  # noqa: PLC0415

    kern = _jit.get_kernel("probe_wgmma.cu", "wgmma_rate_kernel<128>")
    a, b = _operands(cp, 7)
    grid = ctas_per_sm * _sm_count(cp)
    out = cp.empty(grid * 128, dtype=cp.float32)
    ms = bench.time_it(cp, lambda _: kern((grid,), (128,), (a, b, np.int32(rounds), out), shared_mem=16 * 1024),
                       [None], warmup=2, repeats=10)
    return grid * rounds * 2 * 8 * MMA_FLOPS / (ms * 1e-3)


def overlap_ns(cp, mode: int, ctas_per_sm: int, rounds: int) -> tuple[float, float]:  # gpu-only
    """(nanoseconds per round per SM, mean SM clock in MHz while it ran) of
    wgmma_overlap_kernel<mode> (probe_wgmma.cu) at ctas_per_sm CTAs per SM: the time one SM
    takes for one 128-entry tile's share of work of each of its CTAs (modes 2 and 5: of
    each of its CTAs' two warpgroups)."""
    from indexer import _jit  # noqa: PLC0415

    kern = _jit.get_kernel("probe_wgmma.cu", f"wgmma_overlap_kernel<{mode}>")
    a, b = _operands(cp, 11)
    threads = 256 if mode in (2, 5) else 128
    grid = ctas_per_sm * _sm_count(cp)
    out = cp.empty(grid * threads, dtype=cp.float32)
    clk = cp.zeros(2 * grid, dtype=cp.int64)
    return _timed_with_clock(cp, lambda: kern((grid,), (threads,), (a, b, np.int32(rounds), out, clk),
                                              shared_mem=16 * 1024), clk, rounds, ctas_per_sm)


def overlap_report(cp, rounds: int) -> list[str]:  # gpu-only
    """Lines: the tensor cores' and the CUDA cores' shares of a tile alone and together, in
    ns per tile per SM, with the SM clock (MHz) each ran at."""
    def run(mode, per_sm):
        ns, mhz = overlap_ns(cp, mode, per_sm, rounds)
        return ns, f"{ns:.0f} ({mhz:.0f} MHz)"

    (mma, t0), (alu, t1), (_, t3), (_, t6) = run(0, 3), run(1, 3), run(3, 3), run(6, 3)
    lines = [f"one tile's core work, ns per tile per SM, 3 CTAs/SM: MMA alone {t0}, decode+epilogue alone {t1}, "
             f"both in one warpgroup (the kernel's order) {t3}; sum {mma + alu:.0f}, max {max(mma, alu):.0f}",
             f"keys stationary (the fragments decoded once, each round one query's MMAs and epilogues), "
             f"3 CTAs/SM: {t6} ns per 128 entries per SM"]
    for label, mma_mode, split_mode in (("A in registers", 0, 2), ("A in shared memory", 4, 5)):
        (mma2, t0), (alu2, t1), (_, t2) = run(mma_mode, 2), run(1, 2), run(split_mode, 2)
        lines.append(f"separate warpgroups, 2 CTAs/SM, MMA with {label}: MMA alone {t0}, decode+epilogue alone "
                     f"{t1}, side by side {t2}; sum {mma2 + alu2:.0f}, max {max(mma2, alu2):.0f}")
    return lines


def tile_step_ns(cp, step: int, rounds: int) -> tuple[float, float]:  # gpu-only
    """(ns per tile per SM, MHz) of wgmma_tile_kernel<step> at 3 CTAs per SM: the scoring
    kernel's tile loop rebuilt up to step 1 (codes from shared memory) or 2 (its epilogue)."""
    from indexer import _jit  # noqa: PLC0415

    smem = 16 * 1024 + 9216 + 64 * 4 + 128 * 4 + 2048 * 4  # kTileSmemBytes in probe_wgmma.cu
    kern = _jit.get_kernel("probe_wgmma.cu", f"wgmma_tile_kernel<{step}>")
    _, b = _operands(cp, 13, with_a=False)
    grid = 3 * _sm_count(cp)
    out = cp.empty(grid * 64 * 128, dtype=cp.float32)
    clk = cp.zeros(2 * grid, dtype=cp.int64)
    return _timed_with_clock(cp, lambda: kern((grid,), (128,), (b, np.int32(rounds), out, clk), shared_mem=smem),
                             clk, rounds, 3)


def scoring_ms(cp, cuda_ops, case, sets) -> float | None:  # gpu-only
    """Graph-replay milliseconds of the fast path's scoring alone on the input sets."""
    def fn(x):
        return bench.call_case(cuda_ops, x, case.top_k, validate=False, _score_only=True)
    return bench.time_graph(cp, fn, sets)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="decode-1M,decode-128K")
    ap.add_argument("--rounds", type=int, default=4096, help="MMA rounds (one 128-entry tile's MMAs each) per CTA")
    args = ap.parse_args(argv)
    try:
        cp = bench.require_gpu()
    except bench.GPUUnavailable as exc:
        print(exc)
        return 2
    from indexer import cuda_ops  # noqa: PLC0415

    bw, rate = bench.ceilings(cp)
    print(f"# {bench.device_name(cp)}  copy {bw / 1e12:.2f} TB/s  fp16 GEMM (8192^3) {rate / 1e12:.0f} TFLOP/s")
    for per_sm in (1, 2, 3):
        r = wgmma_rate(cp, per_sm, args.rounds)
        print(f"wgmma m64n64k16 (A in registers), {per_sm} CTA(s)/SM: {r / 1e12:6.0f} TFLOP/s "
              f"({r / rate:.2f} x the GEMM)")
    for line in overlap_report(cp, args.rounds // 4):
        print(line)
    steps = [tile_step_ns(cp, step, args.rounds // 4) for step in (1, 2, 3)]
    print("the tile loop rebuilt, ns per tile per SM at 3 CTAs/SM: + codes and scales from shared memory "
          f"{steps[0][0]:.0f} ({steps[0][1]:.0f} MHz), + the kernel's epilogue (weights from shared memory, "
          f"shuffles, score stores, histogram) {steps[1][0]:.0f} ({steps[1][1]:.0f} MHz); keys stationary "
          f"(decoded once, a query a round, a barrier a round) {steps[2][0]:.0f} ({steps[2][1]:.0f} MHz)")
    sms = _sm_count(cp)
    for i, case in enumerate(bench.select_cases(args.cases)):
        sets, counts = bench.input_sets(case, cp, i)
        floor_ms = bench.floor_seconds(counts, bw, rate) * 1e3
        real = scoring_ms(cp, cuda_ops, case, sets)
        hot = scoring_ms(cp, cuda_ops, case, [dict(x, block_table=fold_block_table(x["block_table"])) for x in sets])
        line = f"{case.name:15s} floor {floor_ms:.3f} ms"
        for name, ms in (("scoring", real), (f"hot pool ({HOT_BLOCKS} blocks)", hot)):
            if ms is not None:
                line += f"  {name} {ms:.3f} ms = {ms / floor_ms:.2f} x floor, {counts['flops'] / ms / 1e9:.0f} TFLOP/s"
        tiles = int(sum(-(-int(n) // 128) for n in cp.asnumpy(sets[0]["valid_lens"])))
        if real is not None:
            line += f"  ({real * 1e6 / (tiles / sms):.0f} ns per tile per SM)"
        print(line)
        del sets
        bench.free_device_memory(cp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
