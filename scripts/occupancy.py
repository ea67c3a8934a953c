#!/usr/bin/env python3
"""Resident CTAs per SM of the fast path's kernels, as the driver's occupancy calculator
gives them (registers, shared memory, threads), next to what the launch geometry assumes.
GPU only. A grid sized for more resident CTAs than fit runs as extra waves: check this
before reading a timing of a changed __launch_bounds__ or shared-memory layout.

    python scripts/occupancy.py
"""

import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer import _jit, bench, geometry  # noqa: E402


def resident(kernel, threads: int, smem: int) -> int:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor for a CuPy RawKernel."""
    driver = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
    n = ctypes.c_int(0)
    rc = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(kernel.kernel.ptr),
                                                            threads, ctypes.c_size_t(smem))
    if rc != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed with CUDA error {rc}")
    return n.value


def main() -> None:
    cp = bench.require_gpu()
    cp.zeros(1)  # a context on the current device
    # (source, kernel, threads, dynamic shared memory, CTAs per SM the geometry launches)
    rows = [
        ("score_wgmma.cu", "score_wgmma_kernel<128>", 128, geometry.wgmma_smem_bytes(128),
         geometry.score_wgmma_launch(64, 64, 128, 262_144).grid[0] // geometry.H200.sm_count),
        ("score_wgmma.cu", "score_wgmma_pairs_kernel<128>", 128, geometry.wgmma_pairs_smem_bytes(128),
         geometry.score_wgmma_pairs_launch(64, 64, 128, 65_536).grid[0] // geometry.H200.sm_count),
        ("score_ws.cu", "score_ws_kernel<128>", 256, geometry.ws_smem_bytes(128),
         geometry.score_ws_launch(1, 64, 128, 262_144).grid[0] // geometry.H200.sm_count),
        ("score_ks.cu", "score_ks_kernel<128>", 384, geometry.ks_smem_bytes(128),
         geometry.score_ks_launch(4096, 64, 128, 263_168).grid[0] // geometry.H200.sm_count),
        ("score_dense.cu", "score_dense_kernel<128>", geometry.DENSE_THREADS, geometry.dense_smem_bytes(128),
         geometry.score_dense_launch(8192, 64, 128, 2048).grid[0] // geometry.H200.sm_count),
        ("select_fast.cu", "topk_row_kernel<256, 4096, 16>", 256, 0, None),
        ("select_fast.cu", "topk_row_kernel<128, 1024, 16>", 128, 0, None),
        ("select_fast.cu", "topk_row_kernel<128, 512, 16>", 128, 0, None),
        ("select_fast.cu", "topk_rank_kernel<256, false>", 256, 0, None),
        ("select_fast.cu", "topk_rank_kernel<256, true>", 256, 0, None),
        ("select_fast.cu", "topk_filter_kernel<256, 16>", 256, 0, None),
    ]
    print(f"{'kernel':36s} {'regs':>5s} {'static B':>9s} {'dynamic B':>10s} {'fit/SM':>7s} {'launched/SM':>12s}")
    for source, name, threads, smem, launched in rows:
        k = _jit.get_kernel(source, name)
        if smem > 48 * 1024:
            k.max_dynamic_shared_size_bytes = smem
        fit = resident(k, threads, smem)
        flag = "" if launched is None or launched <= fit else "  <- more waves than one"
        print(f"{name:36s} {k.num_regs:5d} {k.shared_size_bytes:9d} {smem:10d} {fit:7d} "
              f"{'' if launched is None else launched:>12}{flag}")


if __name__ == "__main__":
    main()
