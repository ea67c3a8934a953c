#!/usr/bin/env python3
"""Resident CTAs per SM of the fast path's kernels (registers, shared memory, threads), next
to what the launch geometry assumes. A grid sized for more resident CTAs than fit runs as
extra waves: check this before reading a timing of a changed __launch_bounds__ or
shared-memory layout.

    python scripts/occupancy.py            # on a GPU: the driver's occupancy calculator
    python scripts/occupancy.py --static   # no GPU: each kernel's cubin (NVRTC, cuobjdump -res-usage)
                                           # and sm_90's per-SM limits (ctas_per_sm)

The static form needs what scripts/sass_census.py needs (libnvrtc, cuobjdump) and counts
as the CUDA occupancy calculator does on sm_90: registers in 256-register units a warp,
each of the SM's four register files holding whole warps; shared memory with its 1 KB a
CTA reserved; at most 2,048 threads and 32 CTAs an SM.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from indexer import _jit, bench, geometry  # noqa: E402


@dataclass(frozen=True)
class SmLimits:
    """An SM's occupancy limits (the CUDA occupancy calculator's figures for sm_90)."""
    register_files: int = 4           # one a scheduler; a warp's registers lie in one
    registers_per_file: int = 16_384
    register_unit: int = 256          # a warp's registers are allocated in these
    shared_bytes: int = 228 * 1024    # the largest shared-memory carve-out
    shared_reserved: int = 1024       # taken by the system from every CTA's share
    shared_unit: int = 128
    max_threads: int = 2048
    max_ctas: int = 32


SM90 = SmLimits()


def ctas_per_sm(registers: int, threads: int, shared_bytes: int, limits: SmLimits = SM90) -> int:
    """CTAs of ``threads`` threads that fit an SM at once, each thread holding ``registers``
    registers and each CTA ``shared_bytes`` of shared memory (static and dynamic)."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // limits.register_unit) * limits.register_unit
    by_registers = (limits.registers_per_file // per_warp * limits.register_files) // warps if per_warp else limits.max_ctas
    unit = limits.shared_unit
    per_cta = -(-(shared_bytes + limits.shared_reserved) // unit) * unit
    by_shared = limits.shared_bytes // per_cta
    return min(by_registers, by_shared, limits.max_threads // threads, limits.max_ctas)


def cubin_static_shared(shared: int, arch: str, limits: SmLimits = SM90) -> int:
    """A kernel's own static shared bytes from ``cuobjdump -res-usage``'s SHARED, which from
    sm_90 on also counts the 1 KB the system reserves in every CTA (a kernel with none of
    its own reads 1,024 there, 0 for sm_80 and sm_89)."""
    major = int("".join(ch for ch in arch.split("_")[1] if ch.isdigit())) // 10
    return shared - limits.shared_reserved if major >= 9 else shared


def rows():
    """(source, kernel, threads, dynamic shared memory, CTAs per SM the geometry launches or None)."""
    sms = geometry.H200.sm_count
    return [
        ("score_wgmma.cu", "score_wgmma_kernel<128>", 128, geometry.wgmma_smem_bytes(128),
         geometry.score_wgmma_launch(64, 64, 128, 262_144).grid[0] // sms),
        ("score_wgmma.cu", "score_wgmma_pairs_kernel<128>", 128, geometry.wgmma_pairs_smem_bytes(128),
         geometry.score_wgmma_pairs_launch(64, 64, 128, 65_536).grid[0] // sms),
        ("score_ws.cu", "score_ws_kernel<128>", 256, geometry.ws_smem_bytes(128),
         geometry.score_ws_launch(1, 64, 128, 262_144).grid[0] // sms),
        ("score_ks.cu", "score_ks_kernel<128>", 384, geometry.ks_smem_bytes(128),
         geometry.score_ks_launch(4096, 64, 128, 263_168).grid[0] // sms),
        ("score_dense.cu", "score_dense_kernel<128>", geometry.DENSE_THREADS, geometry.dense_smem_bytes(128),
         geometry.score_dense_launch(8192, 64, 128, 2048).grid[0] // sms),
        ("select_fast.cu", "topk_row_kernel<256, 4096, 16>", 256, 0, None),
        ("select_fast.cu", "topk_row_kernel<128, 1024, 16>", 128, 0, None),
        ("select_fast.cu", "topk_row_kernel<128, 512, 16>", 128, 0, None),
        ("select_fast.cu", "topk_rank_kernel<256, false>", 256, 0, None),
        ("select_fast.cu", "topk_rank_kernel<256, true>", 256, 0, None),
        ("select_fast.cu", "topk_filter_kernel<256, 16>", 256, 0, None),
        ("select_fast.cu", "topk_filter_kernel<256, 16, true>", 256, 0, None),
        ("select_fast.cu", f"topk_row_stream_kernel<{geometry.ROW_STREAM_THREADS}>", geometry.ROW_STREAM_THREADS,
         geometry.ROW_STREAM_SMEM, None),
    ]


def resident(kernel, threads: int, smem: int) -> int:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor for a CuPy RawKernel."""
    driver = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
    n = ctypes.c_int(0)
    rc = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(kernel.kernel.ptr),
                                                            threads, ctypes.c_size_t(smem))
    if rc != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed with CUDA error {rc}")
    return n.value


def line(name: str, regs: int, static: int, smem: int, fit: int, launched, note: str = "") -> str:
    flag = "" if launched is None or launched <= fit else "  <- more waves than one"
    return (f"{name:36s} {regs:5d} {static:9d} {smem:10d} {fit:7d} {'' if launched is None else launched:>12}"
            f"{note}{flag}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static", action="store_true",
                    help="no GPU: registers and static shared memory from each kernel's sm_90a cubin, sm_90's limits")
    args = ap.parse_args(argv)
    cp = None
    if not args.static:
        try:
            cp = bench.require_gpu()
        except bench.GPUUnavailable as exc:
            print(f"{exc} (--static needs none)")
            return 2
    print(f"{'kernel':36s} {'regs':>5s} {'static B':>9s} {'dynamic B':>10s} {'fit/SM':>7s} {'launched/SM':>12s}")
    if args.static:
        import sass_census  # noqa: PLC0415  (scripts/: NVRTC and cuobjdump)

        for source, name, threads, smem, launched in rows():
            use = sass_census.resource_usage(name, _jit.read_source(source), source, "sm_90a")
            static = cubin_static_shared(use["SHARED"], "sm_90a")
            fit = ctas_per_sm(use["REG"], threads, static + smem)
            frame = use.get("STACK", 0) + use.get("LOCAL", 0)  # spills go to the stack frame
            print(line(name, use["REG"], static, smem, fit, launched, f"  (stack frame {frame} B a thread)" if frame else ""))
        return 0
    cp.zeros(1)  # a context on the current device
    for source, name, threads, smem, launched in rows():
        k = _jit.get_kernel(source, name)
        if smem > 48 * 1024:
            k.max_dynamic_shared_size_bytes = smem
        print(line(name, k.num_regs, k.shared_size_bytes, smem, resident(k, threads, smem), launched))
    return 0


if __name__ == "__main__":
    sys.exit(main())
