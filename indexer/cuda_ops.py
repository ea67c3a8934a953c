"""The CUDA backend of ``score_topk``: device arrays in, launches on the current CuPy stream.

Imported only when the GPU path is taken (it imports CuPy). With ``validate=False`` nothing
here synchronises with the host: shapes and dtypes are still checked (host metadata only),
and the kernels clamp lengths and skip out-of-range block ids, so no input can make them
read or write outside the arrays.
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np

from . import _jit, arrays, geometry, validate as _validate

__all__ = ["score_topk", "device_facts"]


@functools.cache
def device_facts(device_id: int) -> geometry.Device:
    props = cp.cuda.runtime.getDeviceProperties(device_id)
    return geometry.Device(
        sm_count=int(props["multiProcessorCount"]),
        max_smem_per_block=int(props.get("sharedMemPerBlockOptin", props["sharedMemPerBlock"])),
        compute_capability=int(props["major"]) * 10 + int(props["minor"]),
    )


def _kernel(source, launch_name, device_id, smem=0):
    kern = _jit.get_kernel(source, launch_name, device_id)
    if smem > 48 * 1024 and kern.max_dynamic_shared_size_bytes < smem:
        kern.max_dynamic_shared_size_bytes = smem
    return kern


def _check_alignment(name, x):
    if x.data.ptr % 16:
        raise ValueError(f"{name}: expected a 16-byte aligned device array (got an offset view)")


def score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k, *,
               precision="fast", return_scores=False, physical=False, validate=True,
               workspace_budget=256 << 20):
    """CUDA score + top-k; arguments as ``indexer.score_topk``. Returns CuPy arrays for device
    inputs and NumPy arrays when ``q`` came from the host."""
    like = q
    names = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens")
    given = (q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens)
    dev_arrays = []
    for name, x in zip(names, given):
        if isinstance(x, np.ndarray) or arrays.is_cupy(x) or arrays.is_device_array(x):
            dev_arrays.append(arrays.to_cupy(x))
        else:
            raise TypeError(f"{name}: expected a NumPy, CuPy or DLPack CUDA array, got {type(x).__name__}")
    q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens = dev_arrays
    prob = _validate.check_score_topk(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens,
                                      top_k, values=validate)
    _check_alignment("keys_fp4", keys_fp4)
    device_id = q.device.id
    with cp.cuda.Device(device_id):
        dev = device_facts(device_id)
        indices = cp.empty((prob.T, prob.top_k), dtype=cp.int32)
        scores = cp.empty((prob.T, prob.top_k), dtype=cp.float32) if return_scores else None
        _launch(precision, prob, dev, device_id, q, w, keys_fp4, key_scale, key_gscale, block_table,
                valid_lens, indices, scores, physical, workspace_budget)
    if arrays.framework_of(like) == "numpy" and isinstance(like, np.ndarray):
        indices = indices.get()
        scores = scores.get() if scores is not None else None
    else:
        indices = arrays.wrap_like(indices, like)
        scores = arrays.wrap_like(scores, like) if scores is not None else None
    return (indices, scores) if return_scores else indices


def _launch(precision, prob, dev, device_id, q, w, keys_fp4, key_scale, key_gscale, block_table,
            valid_lens, indices, scores, physical, workspace_budget):
    """Scores of a run of query rows into a float32 workspace (FP32 CUDA cores for 'exact',
    fp16 tensor cores for 'fast'), then the exact radix select."""
    i32 = np.int32
    if precision == "exact":
        sl = geometry.score_fp32_launch(prob.T, prob.H, prob.D, prob.max_len, dev)
        score_k = _kernel("score_fp32.cu", sl.name, device_id, sl.smem)
        shape_args = (i32(prob.H), i32(prob.D), i32(prob.P), i32(prob.E), i32(prob.L))
    else:
        sl = geometry.score_mma_launch(prob.T, prob.H, prob.D, prob.max_len, dev)
        score_k = _kernel("score_mma.cu", sl.name, device_id, sl.smem)
        shape_args = (i32(prob.H), i32(prob.P), i32(prob.E), i32(prob.L))
    rows = geometry.workspace_rows(prob.T, sl.ld, workspace_budget)
    fused_hist = precision != "exact"  # the tensor-core kernel counts the histogram itself
    hist_k = _kernel("select_fast.cu", "topk_histogram_kernel<256, 16>", device_id)
    thr_k = _kernel("select_fast.cu", "topk_threshold_kernel", device_id)
    filter_k = _kernel("select_fast.cu", "topk_filter_kernel<256, 16>", device_id)
    cap = geometry.CANDIDATE_CAP
    final_k = _kernel("select_fast.cu", f"topk_final_kernel<1024, {cap}>", device_id, 8 * cap)
    chunks = geometry.select_fast_chunks(sl.ld)
    bins = geometry.HIST_BINS
    scores_ws = cp.empty((rows, sl.ld), dtype=cp.float32)
    counters = cp.empty(rows * (bins + 2), dtype=cp.uint32)
    hist = counters[: rows * bins]                     # [rows, bins] per-row histogram
    thr = counters[rows * bins: rows * (bins + 1)]     # [rows] threshold bin
    count = counters[rows * (bins + 1):]               # [rows] candidate count
    cand = cp.empty((rows, cap), dtype=cp.uint64)
    ld = np.int64(sl.ld)
    out_scores = scores if scores is not None else None
    for r0 in range(0, prob.T, rows):
        r1 = min(prob.T, r0 + rows)
        nr = r1 - r0
        counters.fill(0)
        lens = valid_lens[r0:r1]
        score_k((nr, sl.grid[1]), sl.block,
                (q[r0:r1], w[r0:r1], keys_fp4, key_scale, key_gscale, block_table[r0:r1], lens,
                 *shape_args, i32(sl.tiles_per_cta), scores_ws, ld, *((hist,) if fused_hist else ())),
                shared_mem=sl.smem)
        if not fused_hist:
            hist_k((nr, chunks), (256,), (scores_ws, ld, lens, i32(prob.max_len), hist))
        thr_k((nr,), (256,), (hist, i32(prob.top_k), thr))
        filter_k((nr, chunks), (256,), (scores_ws, ld, lens, i32(prob.max_len), thr, count, cand, i32(cap)))
        final_k((nr,), (1024,), (scores_ws, ld, lens, i32(prob.max_len), count, cand,
                                 i32(prob.top_k), block_table[r0:r1], i32(prob.L), i32(prob.E), i32(prob.P),
                                 i32(1 if physical else 0), indices[r0:r1],
                                 out_scores[r0:r1] if out_scores is not None else 0),
                shared_mem=8 * cap)
