"""Batch 1 decode (decode-latency's shape: 262,144 entries, H 64, D 128, k 1024) from a
bfloat16, float16 or float8_e4m3fn query: read by the kernels where it lies, against the cast an engine
pays otherwise (q.float() into a kept buffer, then the float32 call), and the float32 call
alone. Each form is captured in one CUDA graph of 20 calls (torch.cuda.graph) and replayed;
medians of 15 replays, per call.

    PYTHONPATH=. python exp/query_dtype_latency.py
"""

import numpy as np
import torch

import indexer
import indexer.torch_ops as iops
from indexer import testing


def main():
    rng = np.random.default_rng(0)
    p = testing.random_problem(rng, T=1, H=64, D=128, E=64, lens=[262_144], top_k=1024)
    dev = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in p.arrays()]
    q32, rest = dev[0], dev[1:]
    out = (torch.empty((1, 1024), dtype=torch.int32, device="cuda"), torch.empty((1, 1024), device="cuda"))
    forms = {}
    for name in ("bfloat16", "float16", "float8_e4m3fn"):
        q16 = q32.to(getattr(torch, name))
        buf = torch.empty_like(q32)
        forms[f"{name} read in place"] = lambda q16=q16: iops.score_topk(q16, *rest, 1024, out=out)
        forms[f"{name} cast, then float32"] = lambda q16=q16, buf=buf: (
            buf.copy_(q16), iops.score_topk(buf, *rest, 1024, out=out))
    forms["float32"] = lambda: iops.score_topk(q32, *rest, 1024, out=out)
    s = torch.cuda.Stream()
    for name, fn in forms.items():
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()  # compiled, the workspace sized
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(20):
                fn()
        times = []
        for _ in range(15):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / 20)
        print(f"{name:32s} {np.median(times):7.2f} us a call (min {min(times):.2f})")
    check = indexer.score_topk(q32.to(torch.bfloat16), *rest, 1024, return_scores=True)
    ref = indexer.score_topk(q32.to(torch.bfloat16).float(), *rest, 1024, return_scores=True)
    assert torch.equal(check[0], ref[0]) and torch.equal(check[1], ref[1])
    print("bfloat16 in place == its float32 widening: bit for bit")


if __name__ == "__main__":
    main()
