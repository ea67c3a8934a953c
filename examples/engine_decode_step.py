"""A serving engine's decode step around the indexer, in PyTorch, with the scoring captured
in a CUDA graph.

Each step of a toy model:

1. projects the hidden state h (B, hidden) of every request to index queries
   q (B, H=64, D=128) in bfloat16 (as a bf16 model gives them: the indexer reads them as
   they are, no cast), head weights w (B, 64), one new index key and one new value;
2. appends the keys to the requests' sequences in a GPU ``indexer.KeyPool`` (NVFP4 on
   write; ``append_many``: one kernel launch for every request) and the values to a value
   cache addressed by the same physical slots (an engine that keeps its own pool arrays
   would write the keys with ``indexer.write_keys(k, slots, ...)``, which a graph can hold);
3. selects the top_k entries per request with
   ``indexer.score_topk(..., physical=True, validate=False, out=..., workspace=...)``,
   replayed from a ``torch.cuda.CUDAGraph`` captured once (all inputs live in static
   buffers refilled in place; the ``Workspace`` keeps the call's scratch memory private to
   the graph); every step also checks the replay against an eager call, and against the
   same selection made by an ``indexer.prepare``-d call fed the step's own (not static)
   q and w tensors: the form for engines that run eagerly, checked and planned once and
   replayed from graphs of its own where the same tensors come again;
4. gathers the selected values (``index_select`` on the value cache by physical slot) and
   attends over them (sparse attention), updating h.

    python examples/engine_decode_step.py [--steps 16] [--device 0]

Needs a CUDA GPU, CuPy and PyTorch. ``main(...)`` returns a summary dict (used by the tests).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(steps=16, device=0, batch=4, context=4096, top_k=512, heads=64, head_dim=128, hidden=512,
         value_dim=128, entries_per_block=64, seed=0, verbose=True):
    """Run ``steps`` decode steps of ``batch`` requests that start with ``context`` cached
    entries each; returns {'steps', 'graph_matches_eager', 'replay_ms', 'eager_ms', ...}."""
    import cupy as cp  # noqa: PLC0415  (the example's own dependencies, imported on use)
    import torch  # noqa: PLC0415

    import indexer  # noqa: PLC0415

    B, H, D, E = batch, heads, head_dim, entries_per_block
    L = -(-(context + steps) // E)  # logical blocks per request: room for the whole run
    dev = torch.device("cuda", device)
    with cp.cuda.Device(device), torch.cuda.device(device):
        gen = torch.Generator(device=dev).manual_seed(seed)

        def randn(*shape, scale=1.0):
            return torch.randn(*shape, device=dev, generator=gen) * scale

        # the "model": fixed random projections
        W_q = randn(hidden, H * D, scale=hidden ** -0.5)
        W_w = randn(hidden, H, scale=hidden ** -0.5)
        W_k = randn(hidden, D, scale=hidden ** -0.5)
        W_v = randn(hidden, value_dim, scale=hidden ** -0.5)
        W_a = randn(hidden, value_dim, scale=hidden ** -0.5)  # attention query over the values
        W_o = randn(value_dim, hidden, scale=value_dim ** -0.5)

        pool = indexer.KeyPool(B * L, entries_per_block=E, head_dim=D, device=f"cuda:{device}")
        seqs = [f"req-{b}" for b in range(B)]
        values = torch.zeros(B * L * E, value_dim, device=dev)  # value cache, row = physical slot

        def slots(first, count):
            """int64 (B, count) physical slots of the entries first .. first+count-1 of every request."""
            table = cp.asnumpy(pool.block_table(seqs, width=L)).astype(np.int64)
            s = np.arange(first, first + count)
            return torch.from_numpy(table[:, s // E] * E + s % E).to(dev)

        # prefill: `context` keys and values per request
        for seq in seqs:
            pool.append(seq, randn(context, D))
        values[slots(0, context).reshape(-1)] = randn(B * context, value_dim)

        # static buffers: what the captured graph reads and writes, at fixed addresses
        q_buf = torch.zeros(B, H, D, device=dev, dtype=torch.bfloat16)
        w_buf = torch.zeros(B, H, device=dev)
        table_buf = torch.full((B, L), -1, dtype=torch.int32, device=dev)
        lens_buf = torch.zeros(B, dtype=torch.int32, device=dev)
        idx_buf = torch.empty(B, top_k, dtype=torch.int32, device=dev)
        ws = indexer.Workspace()
        pool_arrays = (pool.keys_fp4, pool.key_scale, pool.key_gscale)  # CuPy; appends write them in place

        def select(**kw):
            return indexer.score_topk(q_buf, w_buf, *pool_arrays, table_buf, lens_buf, top_k, physical=True, **kw)

        # the eager engine's form: checked and planned once for these shapes, called each step
        prepared = indexer.prepare(q_buf, w_buf, *pool_arrays, table_buf, lens_buf, top_k, physical=True)
        prepared_idx = torch.empty(B, top_k, dtype=torch.int32, device=dev)

        h = randn(B, hidden)
        graph, matches, prepared_matches = None, 0, 0
        replay_ms, eager_ms, prepared_ms = [], [], []
        for step in range(steps):
            # 1. the model: index queries, weights, the new key and value
            q = (h @ W_q).view(B, H, D).to(torch.bfloat16)
            w = (h @ W_w) * H ** -0.5
            k_new, v_new = h @ W_k, h @ W_v
            # 2. write the step's entries; refresh the static inputs in place
            n = context + step
            pool.append_many(seqs, k_new)  # one key a request, one launch
            values[slots(n, 1).reshape(-1)] = v_new
            table_buf.copy_(torch.from_dlpack(pool.block_table(seqs, width=L)))
            lens_buf.copy_(torch.from_dlpack(pool.lengths(seqs)))
            q_buf.copy_(q)
            w_buf.copy_(w)
            # 3. the indexer: capture once (after a warm-up that compiles the kernels and
            #    sizes the workspace), then replay
            if graph is None:
                side = torch.cuda.Stream(dev)
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    select(validate=False, out=idx_buf, workspace=ws)
                torch.cuda.current_stream(dev).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    select(validate=False, out=idx_buf, workspace=ws)
            replay_ms.append(_timed(torch, graph.replay)[0])
            ms, eager = _timed(torch, lambda: select(validate=False))
            eager_ms.append(ms)
            assert torch.equal(idx_buf, eager), f"step {step}: graph replay differs from the eager call"
            matches += 1
            ms, _ = _timed(torch, lambda: prepared(q, w, *pool_arrays, table_buf, lens_buf, out=prepared_idx))
            prepared_ms.append(ms)
            assert torch.equal(prepared_idx, eager), f"step {step}: the prepared call differs from the eager one"
            prepared_matches += 1
            # 4. sparse attention over the selected entries (-1 pads rows with fewer than top_k)
            valid = idx_buf >= 0
            picked = values.index_select(0, idx_buf.clamp(min=0).reshape(-1).long()).view(B, top_k, value_dim)
            logits = torch.einsum("bv,bkv->bk", h @ W_a, picked) * value_dim ** -0.5
            attn = torch.softmax(logits.masked_fill(~valid, float("-inf")), dim=1)
            h = torch.nn.functional.layer_norm(h + torch.einsum("bk,bkv->bv", attn, picked) @ W_o, (hidden,))

        summary = {
            "steps": steps, "batch": B, "entries": context + steps, "top_k": top_k,
            "graph_matches_eager": matches, "prepared_matches_eager": prepared_matches, "workspace_bytes": ws.nbytes,
            "replay_ms": float(np.median(replay_ms)), "eager_ms": float(np.median(eager_ms)),
            "prepared_ms": float(np.median(prepared_ms)),
            "hidden_norm": float(h.norm()),
        }
    if verbose:
        print(f"{steps} decode steps, {B} requests, {context} -> {context + steps} entries each, top_k {top_k}, "
              f"H {H} x D {D}")
        print(f"indexer: graph replay {summary['replay_ms']:.3f} ms, eager {summary['eager_ms']:.3f} ms, "
              f"prepared {summary['prepared_ms']:.3f} ms (median per step); workspace {ws.nbytes / 2**20:.1f} MiB")
        print(f"graph-replayed and prepared indices equal the eager ones at all {matches} steps")
    return summary


def _timed(torch, fn):
    """(milliseconds from before to after ``fn``'s work on the current stream, its result)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop), result



if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--top-k", dest="top_k", type=int, default=512)
    args = parser.parse_args()  # (--help works anywhere)
    from _gpu_needs import missing  # (beside this script: on sys.path when it runs)

    if (why := missing()) is not None:
        sys.exit(f"engine_decode_step: {why}")
    t0 = time.perf_counter()
    main(steps=args.steps, device=args.device, batch=args.batch, context=args.context, top_k=args.top_k)
    print(f"done in {time.perf_counter() - t0:.1f} s")
