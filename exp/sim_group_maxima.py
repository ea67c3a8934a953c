"""Simulate, on the bench's random inputs (indexer/bench.py: build), how many 32-entry
groups and candidates a select reads under four bounds: the histogram's bin start (11-bit key
bins, as the filter), the k-th largest group maximum (exact), and that maximum's start of an
11-bit and a 14-bit key bin. Groups as the wgmma kernels write their maxima ("split": tile t,
warp w: entries 16w..16w+15 and 64+16w..+15) or 32 contiguous entries ("contig").
docs/performance.md v78.

    python exp/sim_group_maxima.py ENTRIES E TOP_K ROWS    # e.g. 262144 64 1024 3 (decode-1M's rows)
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from indexer import nvfp4  # noqa: E402

def key(x):  # order-preserving u32 key of float32
    b = x.view(np.uint32)
    return np.where(b >> 31, ~b, b | 0x80000000).astype(np.uint32)

def row(rng, n, E, H=64, D=128):
    P = n // E
    codes = rng.integers(0, 16, size=(n, D), dtype=np.uint8)
    sc = rng.integers(0x28, 0x48, size=(n, D // 16), dtype=np.uint8)
    gs = np.exp2(rng.uniform(-12, -4, size=P)).astype(np.float32)
    k = nvfp4.e2m1_decode(codes).astype(np.float32) * np.repeat(nvfp4.e4m3_decode(sc).astype(np.float32), 16, axis=1)
    q = rng.standard_normal((H, D)).astype(np.float16).astype(np.float32)
    w = rng.standard_normal(H).astype(np.float32)
    s = (np.maximum(k @ q.T, 0) @ w) * np.repeat(gs, E)
    return s.astype(np.float32)

def groups_of(s, layout):
    t = s.reshape(-1, 128)
    if layout == "split":
        g = np.concatenate([t[:, :64].reshape(-1, 4, 16), t[:, 64:].reshape(-1, 4, 16)], axis=2)  # (tiles,4,32)
        return g.reshape(-1, 32)
    return s.reshape(-1, 32)

def main(n=262144, E=64, k=1024, rows=3):
    rng = np.random.default_rng(1)
    for r in range(rows):
        s = row(rng, n, E)
        ks = key(s)
        kth = np.sort(s)[::-1][k - 1]
        # histogram bin start (top 11 bits of the key)
        bins = ks >> 21
        cnt = np.bincount(bins, minlength=2048)[::-1].cumsum()
        tb = 2047 - np.argmax(cnt >= k)
        bound_h = (np.uint32(tb) << 21)
        res = [f"row {r}: k-th {kth:.4g}, pos {np.mean(s > 0):.3f}"]
        for layout in ("split", "contig"):
            G = groups_of(s, layout)
            gmk = key(G.max(axis=1).astype(np.float32))
            mk = np.sort(gmk)[::-1][k - 1]
            for name, b in (("hist-bin", bound_h), ("kth-gmax", mk), ("gmax-bin", (mk >> 21) << 21),
                            ("gmax-14b", (mk >> 18) << 18)):
                live = np.mean(gmk >= b)
                cand = int(np.sum(ks >= b))
                res.append(f"{layout}/{name}: live {live*100:.1f}% cand {cand}")
        print("; ".join(res), flush=True)

if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:]])
