"""What the host-time experiments share (exp/turn_*.py, replay_*.py, eager_*.py): the
batch-1 call they time, and two clocks of host time.

    from host_timing import batch1, host_us, per_call_us   # (run as python exp/<script>.py)
"""

import time

import cupy as cp
import numpy as np

from indexer import testing


def batch1(torch=None):
    """The batch-1 call's CuPy arrays (262,144 entries, H 64, D 128, E 64) and an ``out``
    pair for top-1024 with scores; with ``torch`` (the module), as PyTorch CUDA tensors."""
    p = testing.random_problem(np.random.default_rng(0), T=1, H=64, D=128, E=64, lens=[262_144], top_k=1024)
    dev = [cp.asarray(a) for a in p.arrays()]
    out = (cp.empty((1, 1024), cp.int32), cp.empty((1, 1024), cp.float32))
    if torch is not None:
        cp.cuda.Device().synchronize()
        dev, out = [torch.from_dlpack(x) for x in dev], tuple(torch.from_dlpack(x) for x in out)
    return dev, out


def key_write_forms(torch):
    """The key-write experiments' calls (exp/write_keys_*.py): a decode step's 64 float32
    keys of 128 at entry 5 of 64 blocks of a pool of 4,096 blocks of 64 entries. Returns
    name -> (keys, slots, pool arrays, validate) for CuPy arrays (unchecked and checked) and
    PyTorch tensors (float32 and bfloat16 keys unchecked, float32 checked)."""
    B, D, E, P = 64, 128, 64, 4096
    rng = np.random.default_rng(0)
    pool = (cp.zeros((P, E, D // 2), cp.uint8), cp.zeros((P, E, D // 16), cp.uint8), cp.ones(P, cp.float32))
    keys = cp.asarray(rng.standard_normal((B, D), dtype=np.float32))
    slots = cp.arange(B, dtype=cp.int64) * E + 5
    cp.cuda.Device().synchronize()
    t_pool = [torch.from_dlpack(a) for a in pool]
    t_keys, t_slots = torch.from_dlpack(keys), torch.from_dlpack(slots)
    t_bf16 = t_keys.to(torch.bfloat16)
    torch.cuda.synchronize()
    return {
        "cupy f32 unchecked": (keys, slots, pool, False),
        "cupy f32 checked": (keys, slots, pool, True),
        "torch f32 unchecked": (t_keys, t_slots, t_pool, False),
        "torch bf16 unchecked": (t_bf16, t_slots, t_pool, False),
        "torch f32 checked": (t_keys, t_slots, t_pool, True),
    }


def host_us(fn, n=200, sync_every=20):
    """Median host us of a call of ``fn`` over ``n`` calls, synchronising every
    ``sync_every`` calls (kept out of the times) so the GPU's queue stays short: host time,
    not back-pressure."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) % sync_every == 0:
            cp.cuda.Device().synchronize()
    cp.cuda.Device().synchronize()
    return float(np.median(times) * 1e6)


def per_call_us(fn, n=2000, rounds=20):
    """Median over ``rounds`` of a host-only step's mean us in a loop of ``n`` calls."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return float(np.median(out))


def eager_forms(dev, out, ws):
    """The two eager batch-1 calls timed (name -> call): ``score_topk`` with validate=False,
    out= and workspace ``ws``, and a prepared call of the same without graphs."""
    import indexer  # noqa: PLC0415

    eager = indexer.prepare(*dev, 1024, return_scores=True, workspace=ws, validate=False, graphs=False)
    forms = {
        "score_topk": lambda: indexer.score_topk(*dev, 1024, return_scores=True, out=out, workspace=ws,
                                                 validate=False),
        "prepared eager": lambda: eager(*dev, out=out),
    }
    if type(dev[0]).__module__.startswith("torch"):  # the PyTorch operator too (its own workspace)
        from indexer import torch_ops  # noqa: PLC0415  (registers torch.ops.indexer)

        forms["torch_ops.score_topk (out=)"] = lambda: torch_ops.score_topk(*dev, 1024, out=out)
    return forms


def replaying(dev, out, ws):
    """A prepared call (with scores, on ``ws``) called three times with ``out``: its next calls
    are replays of its graph. Returns it and that graph."""
    import indexer  # noqa: PLC0415

    step = indexer.prepare(*dev, 1024, return_scores=True, workspace=ws, validate=False)
    for _ in range(3):
        step(*dev, out=out)
    cp.cuda.Device().synchronize()
    return step, next(iter(step._graphs.values()))[0]


def profile(fn, calls, sync_every, top):
    """cProfile's ``top`` busiest functions (by own time) over ``calls`` calls of ``fn``."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    prof = cProfile.Profile()
    prof.enable()
    for i in range(calls):
        fn()
        if i % sync_every == 0:
            cp.cuda.Device().synchronize()
    prof.disable()
    cp.cuda.Device().synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)
