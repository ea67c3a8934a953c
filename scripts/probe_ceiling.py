#!/usr/bin/env python3
"""What bounds the fp16 scoring kernels, measured in one run on the GPU.

    python scripts/probe_ceiling.py                      # decode-1M and decode-128K
    python scripts/probe_ceiling.py --cases decode-1M --rounds 8192

Beside bench's ceilings (copy bandwidth, an 8192^3 fp16 GEMM: what the floor is measured
against), it prints
  * the rate of the one MMA shape the scoring kernels issue, alone (wgmma.m64n64k16, A
    from registers, B from shared memory: kernels/probe_wgmma.cu), at 1, 2 and 3 CTAs of
    one warpgroup per SM (the single-warpgroup scoring kernel runs 3);
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


def wgmma_rate(cp, ctas_per_sm: int, rounds: int) -> float:  # gpu-only
    """FLOP/s of wgmma_rate_kernel<128> with ctas_per_sm one-warpgroup CTAs per SM."""
    from indexer import _jit  # noqa: PLC0415

    kern = _jit.get_kernel("probe_wgmma.cu", "wgmma_rate_kernel<128>")
    sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"]
    rng = cp.random.default_rng(7)
    # random fp16 operands (never time on zeros: the tensor cores' power, and so their
    # clock, depends on the data)
    a = rng.standard_normal(8 * 4 * 128 * 2, dtype=cp.float32).astype(cp.float16).view(cp.uint32)
    b = rng.standard_normal(16 * 1024 // 2, dtype=cp.float32).astype(cp.float16)
    grid = ctas_per_sm * sms
    out = cp.empty(grid * 128, dtype=cp.float32)
    ms = bench.time_it(cp, lambda _: kern((grid,), (128,), (a, b, np.int32(rounds), out), shared_mem=16 * 1024),
                       [None], warmup=2, repeats=10)
    return grid * rounds * 2 * 8 * MMA_FLOPS / (ms * 1e-3)


def scoring_ms(cp, cuda_ops, case, sets) -> float | None:  # gpu-only
    """Graph-replay milliseconds of the fast path's scoring alone on the input sets."""
    def fn(x):
        return cuda_ops.score_topk(x["q"], x["w"], x["keys_fp4"], x["key_scale"], x["key_gscale"], x["block_table"],
                                   x["valid_lens"], case.top_k, validate=False, _score_only=True,
                                   _cu_seqlens=x.get("cu_seqlens"))
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
    for i, case in enumerate(bench.select_cases(args.cases)):
        sets, counts = bench.input_sets(case, cp, i)
        floor_ms = bench.floor_seconds(counts, bw, rate) * 1e3
        real = scoring_ms(cp, cuda_ops, case, sets)
        hot = scoring_ms(cp, cuda_ops, case, [dict(x, block_table=fold_block_table(x["block_table"])) for x in sets])
        line = f"{case.name:15s} floor {floor_ms:.3f} ms"
        for name, ms in (("scoring", real), (f"hot pool ({HOT_BLOCKS} blocks)", hot)):
            if ms is not None:
                line += f"  {name} {ms:.3f} ms = {ms / floor_ms:.2f} x floor, {counts['flops'] / ms / 1e9:.0f} TFLOP/s"
        print(line)
        del sets
        bench.free_device_memory(cp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
