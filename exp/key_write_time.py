"""What a decode step's key writes cost on a GPU pool: B sequences, one new key each.

Then ``indexer.write_keys`` of the same B keys into raw pool arrays by slot: eager, checked and
not, and replayed from a CUDA graph (device time). Timed in one process, alternating: ``append_many`` (one kernel launch, kernels/key_write.cu),
with and without its keys' check,
B ``append`` calls (a launch each), and B ``append`` calls through the CuPy array form the
pool used before the kernel (its methods ``_write_into`` / ``_write_new``, still the host
pool's). Also the kernel alone, from CUDA events around 200 launches. Host times are
medians of wall-clock steps, each ended by a synchronize.

    PYTHONPATH=. python exp/key_write_time.py [--batch 64] [--steps 100]
"""

import argparse
import statistics
import time

import cupy as cp
import numpy as np

import indexer
from indexer import KeyPool, keywrite


def old_write_blocks(self, items, k):
    """The pool's CuPy-array writes before the kernel, block by block."""
    for j in range(0, len(items), 4):
        p, used, first, count = items[j: j + 4]
        rows = k[first: first + count]
        if used:
            self._write_into(p, used, rows)
        else:
            self._write_new([p], rows)


def step_times(fn, steps):
    times = []
    for _ in range(steps):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    B, D, E = args.batch, 128, 64
    rng = np.random.default_rng(0)
    pool = KeyPool(4096, entries_per_block=E, head_dim=D, device="cuda")
    seqs = list(range(B))
    pool.append_many(seqs, cp.asarray(rng.standard_normal((B * 100, D), dtype=np.float32)), [100] * B)
    keys = cp.asarray(rng.standard_normal((B, D), dtype=np.float32))

    def many():
        pool.append_many(seqs, keys)

    def many_unchecked():
        pool.append_many(seqs, keys, validate=False)

    def each():
        for i, s in enumerate(seqs):
            pool.append(s, keys[i])

    new_method = KeyPool._write_blocks

    def each_old():
        KeyPool._write_blocks = old_write_blocks
        try:
            each()
        finally:
            KeyPool._write_blocks = new_method

    for fn in (many, many_unchecked, each, each_old):  # warm-up: compiles, pools
        fn()
    assert KeyPool._write_blocks is new_method
    rounds = {"append_many": [], "append_many(validate=False)": [], "append x B": [], "append x B, CuPy form": []}
    for _ in range(3):
        rounds["append_many"].append(step_times(many, args.steps))
        rounds["append_many(validate=False)"].append(step_times(many_unchecked, args.steps))
        rounds["append x B"].append(step_times(each, max(5, args.steps // 10)))
        rounds["append x B, CuPy form"].append(step_times(each_old, max(3, args.steps // 20)))
    print(f"B = {B} sequences, one key of {D} a step, blocks of {E} (median ms a step, three alternations)")
    for name, values in rounds.items():
        print(f"  {name:28s} " + "  ".join(f"{v:8.4f}" for v in values))

    # indexer.write_keys: the same step's keys into raw pool arrays by slot (entry 5 of B blocks)
    codes, scales, g = cp.zeros_like(pool.keys_fp4), cp.zeros_like(pool.key_scale), cp.ones_like(pool.key_gscale)
    slots = cp.arange(B, dtype=cp.int64) * E + 5
    for validate in (True, False):
        t = [step_times(lambda: indexer.write_keys(keys, slots, codes, scales, g, validate=validate), args.steps)
             for _ in range(3)]
        print(f"  write_keys(validate={validate!s:5s}) eager  " + "  ".join(f"{v:8.4f}" for v in t))
    # a prefill chunk's keys: 8,192 keys filling 128 blocks
    chunk = cp.asarray(rng.standard_normal((8192, D), dtype=np.float32))
    chunk_slots = cp.arange(8192, dtype=cp.int64) + 1000 * E
    for validate in (True, False):
        t = [step_times(lambda: indexer.write_keys(chunk, chunk_slots, codes, scales, g, validate=validate),
                        args.steps) for _ in range(3)]
        print(f"  write_keys 8,192 keys (validate={validate!s:5s})  " + "  ".join(f"{v:8.4f}" for v in t))
    # from PyTorch tensors on PyTorch's current stream: viewed by pointer (ordered, v94) or
    # through DLPack's handshake a tensor (streams.on_torch_stream forced False), alternating
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        from indexer import streams
        t_pool = [torch.as_tensor(a, device="cuda") for a in (codes, scales, g)]
        t_keys, t_slots = torch.as_tensor(keys, device="cuda"), torch.as_tensor(slots, device="cuda")
        t_bf16 = t_keys.to(torch.bfloat16)
        real = streams.on_torch_stream

        def torch_call(k, validate, by_pointer):
            streams.on_torch_stream = real if by_pointer else (lambda inputs: False)
            try:
                indexer.write_keys(k, t_slots, *t_pool, validate=validate)
            finally:
                streams.on_torch_stream = real

        for k, kname in ((t_keys, "float32"), (t_bf16, "bfloat16")):
            for validate in (False, True):
                rows = {True: [], False: []}
                for _ in range(3):
                    for by_pointer in (True, False):
                        rows[by_pointer].append(step_times(lambda: torch_call(k, validate, by_pointer), args.steps))
                for by_pointer in (True, False):
                    how = "by pointer" if by_pointer else "DLPack   "
                    print(f"  write_keys torch {kname:8s} validate={validate!s:5s} {how} "
                          + "  ".join(f"{v:8.4f}" for v in rows[by_pointer]))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        indexer.write_keys(keys, slots, codes, scales, g, validate=False)
        graph = stream.end_capture()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        graph.launch(stream)
        start.record(stream)
        for _ in range(200):
            graph.launch(stream)
        end.record(stream)
        end.synchronize()
    print(f"  write_keys replayed from a graph, device time a replay: {cp.cuda.get_elapsed_time(start, end) / 200 * 1e3:.2f} us")

    # the kernel alone: B items of one row each into the sequences' last blocks
    items = [v for i, s in enumerate(seqs) for v in (pool._blocks[s][-1], E - 1, i, 1)]
    keywrite.write_blocks(pool.keys_fp4, pool.key_scale, pool.key_gscale, items, keys)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(200):
        keywrite.write_blocks(pool.keys_fp4, pool.key_scale, pool.key_gscale, items, keys)
    end.record()
    end.synchronize()
    print(f"  kernel + item copy, device time a launch: {cp.cuda.get_elapsed_time(start, end) / 200 * 1e3:.2f} us")


if __name__ == "__main__":
    main()
