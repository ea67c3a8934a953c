"""Is the FP8 query's speed-up (v89) the path or the data? One process, interleaved rounds:
the scoring kernels (graph replay, score only and whole call) on
  f32      the bench's float32 standard-normal query,
  f32<-f8  the same query rounded to float8_e4m3fn and widened back to float32 (float32 path, FP8 values),
  f8       the float8_e4m3fn PyTorch tensor (the bench's fast-f8 path).
If f32<-f8 times as f8 does, the difference is the values (operand bits -> tensor-core power ->
clock), not the path. The SM clock and power are sampled by nvidia-smi alongside.
    PYTHONPATH=. python exp/f8_data_ab.py [case ...]
"""
import datetime
import subprocess
import sys
import time

import cupy as cp
import torch

from indexer import bench, cuda_ops
from indexer.workspace import Workspace

names = sys.argv[1:] or ["prefill-chunk", "prefill-8K", "decode-1M"]
by_name = {c.name: c for c in bench.CASES}
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                        "-lms", "50"], stdout=subprocess.PIPE, text=True)
windows = []  # (label, start, end) wall-clock seconds

for ci, name in enumerate(names):
    case = by_name[name]
    sets, counts = bench.input_sets(case, cp, ci)
    variants = {
        "f32": sets,
        "f32<-f8": [dict(x, q=cp.from_dlpack(bench.float8_query(torch, x["q"]).to(torch.float32))) for x in sets],
        "f8": [dict(x, q=bench.float8_query(torch, x["q"])) for x in sets],
    }
    for only in (True, False):
        res = {k: [] for k in variants}
        for rnd in range(3):
            for k, vs in variants.items():
                ws = Workspace()

                def fn(x, _ws=ws):
                    with bench.torch_on_cupy_stream(torch, cp) if k == "f8" else bench.contextlib.nullcontext():
                        return bench.call_case(cuda_ops, x, case.top_k, precision="fast", validate=False,
                                               _score_only=only, _fast_kernel="auto", workspace=_ws)
                fn(vs[0])
                cp.cuda.Device().synchronize()
                t0 = time.time()
                res[k].append(bench.time_graph(cp, fn, vs, repeats=20, echo=lambda *_: None))
                windows.append((f"{name} {'score' if only else 'whole'} {k}", t0, time.time()))
        line = "  ".join(f"{k} {' '.join(f'{m:.4f}' for m in v)}" for k, v in res.items())
        print(f"{name:14s} {'score' if only else 'whole'}  {line}", flush=True)
    del sets, variants
    bench.free_device_memory(cp)
smi.terminate()
samples = []
for line in smi.communicate()[0].splitlines():
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 3:
        stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((stamp, float(parts[1]), float(parts[2])))
for label, t0, t1 in windows:
    got = [(c, w) for s, c, w in samples if t0 <= s <= t1 and w > 150]
    if got:
        cl = sorted(c for c, _ in got)
        print(f"{label:36s} samples {len(got):3d}  SM MHz median {cl[len(cl) // 2]:.0f} min {cl[0]:.0f}"
              f"  W max {max(w for _, w in got):.0f}")
