"""Where the GPU suite's slowest test (test_row_pairs_share_key_tiles_and_match_single_rows,
[4500, 1] rows) spends its time: each call timed twice (the first includes compiles)."""
import sys
import time

import numpy as np

sys.path.insert(0, "tests")
import cupy as cp  # noqa: E402

from indexer import cuda_ops, testing  # noqa: E402
from test_ragged import as_problem, grouped_problem  # noqa: E402

cases = [([4500, 1], [600, 50], 32), ([700, 500], [300, 200], 40), ([2, 2, 2, 2], [3000] * 4, 100)]
for counts, entries, top_k in cases:
    rng = np.random.default_rng(sum(counts) + top_k)
    args = grouped_problem(rng, counts, H=64, D=128, E=64, seq_entries=entries, top_k=top_k)
    q, w, k, s, g, table, cu, lens = args
    per_token = np.ascontiguousarray(np.repeat(table, np.diff(cu), axis=0))
    dev = [cp.asarray(a) for a in (q, w, k, s, g, per_token, lens)]
    cu_dev = cp.asarray(cu)
    for kernel in ("wgmma", "wgmma-single"):
        for rep in range(2):
            t0 = time.perf_counter()
            out = cuda_ops.score_topk(*dev, top_k, return_scores=True, _cu_seqlens=cu_dev, _fast_kernel=kernel)
            cp.cuda.Device().synchronize()
            print(counts, kernel, rep, f"{time.perf_counter() - t0:.3f} s", flush=True)
    t0 = time.perf_counter()
    testing.check_topk(as_problem(*args, top_k), out[0].get(), out[1].get(), tol=2**-11)
    print(counts, "check", f"{time.perf_counter() - t0:.3f} s", flush=True)
