"""The eager path's dtype names and contiguity flags, A/B in one process: batch-1 eager calls
(score_topk and a prepared call without graphs; 262,144 entries, k 1024, out= and a
workspace) with arrays.dtype_name / arrays.c_contiguous as they are, and as they were
(str of the dtype each time; x.flags), alternating; median host us of 7 rounds each.

    PYTHONPATH=. python exp/eager_ab.py
"""

import numpy as np

import indexer
from indexer import arrays
from host_timing import batch1, eager_forms, host_us


def main():
    dev, out = batch1()
    forms = eager_forms(dev, out, indexer.Workspace())
    now = (arrays.dtype_name, arrays.c_contiguous)
    before = (lambda x: str(x.dtype).rpartition(".")[2], lambda x: bool(x.flags.c_contiguous))
    for name, fn in forms.items():
        fn()
        rows = {"now": [], "before": []}
        for _ in range(7):
            for label, (names, contiguous) in (("now", now), ("before", before)):
                arrays.dtype_name, arrays.c_contiguous = names, contiguous
                rows[label].append(host_us(fn, sync_every=10))
        arrays.dtype_name, arrays.c_contiguous = now
        print(f"{name:16s} now {np.median(rows['now']):6.1f} us  before {np.median(rows['before']):6.1f} us  "
              f"(now {' '.join(f'{x:.0f}' for x in rows['now'])}; before {' '.join(f'{x:.0f}' for x in rows['before'])})")


if __name__ == "__main__":
    main()
