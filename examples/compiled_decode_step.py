"""A compiled PyTorch decode step over the engine's own paged NVFP4 pool: the step's keys
written and its top-k selected by ``torch.ops.indexer.write_keys`` and ``score_topk`` in one
``torch.compile`` graph, captured in a CUDA graph at a padded batch size.

An engine that keeps its index-key pool as tensors of its own (no ``indexer.KeyPool``):

1. the pool: ``keys_fp4`` (P, E, D/2) uint8, ``key_scale`` (P, E, D/16) uint8 and
   ``key_gscale`` (P,) float32, each request's blocks scattered over it by a block table;
   each request's prompt keys written once, checked (``iops.write_keys(..., validate=True)``);
2. the step, one function under ``torch.compile(fullgraph=True)``: the new bfloat16 key of
   every request written at its physical slot (-1 for the rows that pad the batch to the
   captured size: neither written nor checked), then the top-k entries of every request
   (``physical=True``: indices address the pool, as a sparse-attention gather wants);
3. the compiled step captured in a ``torch.cuda.CUDAGraph`` once (its warm-up call writes
   nothing: every slot -1) and replayed each step with its static buffers refilled.

Every step is checked against the same step run eagerly on a second copy of the pool (the
same indices); at the end both pools are checked byte for byte against the host form
(``indexer.write_keys`` on NumPy arrays, the specification) and the last step's selection
against the float64 reference.

    python examples/compiled_decode_step.py [--steps 8] [--device 0]

Needs a CUDA GPU, CuPy and PyTorch (2.4 or later). ``main(...)`` returns a summary dict (used
by the tests).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(steps=8, device=0, batch=3, padded_batch=4, context=1000, top_k=256, heads=64, head_dim=128,
         entries_per_block=64, pool_blocks=None, seed=0, verbose=True):
    """Run ``steps`` decode steps of ``batch`` requests (padded to ``padded_batch`` rows)
    whose prompts hold about ``context`` keys each, in a pool of ``pool_blocks`` blocks (by
    default just the requests'); returns {'steps', 'replay_matches_eager',
    'pool_matches_host', 'replay_ms', 'eager_ms', ...}."""
    import torch  # noqa: PLC0415  (the example's own dependencies, imported on use)

    import indexer  # noqa: PLC0415
    import indexer.torch_ops as iops  # noqa: PLC0415
    from indexer import testing  # noqa: PLC0415

    B, Bp, H, D, E = batch, padded_batch, heads, head_dim, entries_per_block
    if Bp < B:
        raise ValueError(f"padded_batch: expected at least batch = {B}, got {Bp}")
    L = -(-(context + steps) // E)  # blocks a request: room for the whole run
    P = max(B * L, pool_blocks or 0)
    dev = torch.device("cuda", device)
    with torch.cuda.device(device):
        gen = torch.Generator(device=dev).manual_seed(seed)

        def randn(*shape, dtype=torch.float32):
            return torch.randn(*shape, device=dev, generator=gen).to(dtype)

        # 1. the engine's pool: every request's blocks scattered over the pool
        pool = (torch.zeros(P, E, D // 2, dtype=torch.uint8, device=dev),
                torch.zeros(P, E, D // 16, dtype=torch.uint8, device=dev),
                torch.ones(P, dtype=torch.float32, device=dev))
        table = torch.zeros(Bp, L, dtype=torch.int32, device=dev)  # padding rows: no visible block
        table[:B] = torch.randperm(P, device=dev, generator=gen)[:B * L].view(B, L).to(torch.int32)
        lens = torch.zeros(Bp, dtype=torch.int32, device=dev)
        lens[:B] = torch.tensor([context - 37 * b for b in range(B)], dtype=torch.int32)

        def slots_of(rows, positions):
            """int64 physical slots of entries ``positions`` of requests ``rows``."""
            return table[rows, positions // E].long() * E + positions % E

        writes = []  # every write, in order, for the host form at the end
        for b in range(B):
            k = randn(int(lens[b]), D, dtype=torch.bfloat16)
            s = slots_of(b, torch.arange(int(lens[b]), device=dev))
            iops.write_keys(k, s, *pool, validate=True)
            writes.append((k, s))
        eager_pool = tuple(t.clone() for t in pool)

        # 2. the step
        def step(q, w, k_new, slots, lens_now, keys_fp4, key_scale, key_gscale):
            iops.write_keys(k_new, slots, keys_fp4, key_scale, key_gscale)
            return iops.score_topk(q, w, keys_fp4, key_scale, key_gscale, table, lens_now, top_k, physical=True)[0]

        compiled = torch.compile(step, fullgraph=True)

        # 3. static buffers, a warm-up that writes nothing, the capture
        q_buf = torch.zeros(Bp, H, D, dtype=torch.bfloat16, device=dev)
        w_buf = torch.zeros(Bp, H, device=dev)
        k_buf = torch.zeros(Bp, D, dtype=torch.bfloat16, device=dev)
        slots_buf = torch.full((Bp,), -1, dtype=torch.int64, device=dev)
        lens_buf = lens.clone()
        static = (q_buf, w_buf, k_buf, slots_buf, lens_buf, *pool)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):  # compiles, sizes the workspace; slots all -1: the pool is untouched
                compiled(*static)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            idx_buf = compiled(*static)

        matches, replay_ms, eager_ms = 0, [], []
        for n in range(steps):
            q = randn(Bp, H, D, dtype=torch.bfloat16)
            w = randn(Bp, H) * H ** -0.5
            k_new = randn(Bp, D, dtype=torch.bfloat16)
            rows = torch.arange(B, device=dev)
            slots = torch.full((Bp,), -1, dtype=torch.int64, device=dev)
            slots[:B] = slots_of(rows, lens[:B].long())  # each request's next entry
            lens[:B] += 1
            writes.append((k_new[:B], slots[:B]))
            for buf, value in zip(static, (q, w, k_new, slots, lens)):
                buf.copy_(value)
            replay_ms.append(_timed(torch, graph.replay)[0])
            ms, eager_idx = _timed(torch, lambda: step(q, w, k_new, slots, lens, *eager_pool))
            eager_ms.append(ms)
            assert torch.equal(idx_buf, eager_idx), f"step {n}: the graph's selection differs from the eager step's"
            matches += 1

        # the specification: the host form of every write, and the reference's selection
        host = (np.zeros((P, E, D // 2), np.uint8), np.zeros((P, E, D // 16), np.uint8), np.ones(P, np.float32))
        for k, s in writes:
            indexer.write_keys(k.float().cpu().numpy(), s.cpu().numpy(), *host)
        for got in (pool, eager_pool):
            for name, a, b in zip(("keys_fp4", "key_scale", "key_gscale"), got, host):
                assert np.array_equal(a.cpu().numpy(), b), f"{name}: the device pool differs from the host form"
        problem = testing.Problem(q.float().cpu().numpy(), w.cpu().numpy(), *host, table.cpu().numpy(),
                                  lens.cpu().numpy(), top_k)
        testing.check_topk(problem, idx_buf.cpu().numpy(), tol=testing.TOL_FAST, physical=True)

        summary = {
            "steps": steps, "batch": B, "padded_batch": Bp, "entries": int(lens.max()), "top_k": top_k,
            "replay_matches_eager": matches, "pool_matches_host": True,
            "replay_ms": float(np.median(replay_ms)), "eager_ms": float(np.median(eager_ms)),
        }
        if verbose:
            print(f"{steps} steps of {B} requests padded to {Bp}, {summary['entries']} entries, top_k {top_k}: "
                  f"replay {summary['replay_ms']:.3f} ms, eager step {summary['eager_ms']:.3f} ms a step; "
                  "the graph matches the eager step, the pools the host form, the selection the reference")
        return summary


def _timed(torch, fn):
    """(milliseconds, result) of ``fn()`` on the current stream, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end), result



if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--pool-blocks", type=int, default=None, help="blocks in the pool (default: the requests')")
    args = ap.parse_args()  # (--help works anywhere)
    from _gpu_needs import missing  # (beside this script: on sys.path when it runs)

    if (why := missing()) is not None:
        sys.exit(f"compiled_decode_step: {why}")
    t0 = time.perf_counter()
    main(steps=args.steps, device=args.device, pool_blocks=args.pool_blocks)
    print(f"done in {time.perf_counter() - t0:.1f} s")
