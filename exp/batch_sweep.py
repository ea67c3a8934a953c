"""Decode at small and middling batches: B requests of one query row each over the same
number of entries (k = 1,024 unless given), the default path against each single-query
scoring kernel forced (the warp-specialised kernel and the wgmma kernel; geometry.ws_preferred
says which the default takes: one row only until v104, a few long rows since), whole calls
and scoring alone: indexer.bench.run on its cases of one's own shape (decode-BxN-kK-EE), so
the table, the floor and the JSON are the bench's, each shape's paths in the order given (a
shape's first path tends to read a few per cent slower: compare forced kernels with each
other). Its first runs (v104, docs/bench/2026-12-07-v104-h100-batch-sweep.json) were its own
loop's and printed their own lines.

    PYTHONPATH=. python exp/batch_sweep.py [--batches 1,2,4,8,16,32,64] [--entries 262144] [--E 64] [--k 1024]
                                           [--paths fast,fast-score,fast-ws,fast-ws-score,fast-wgmma,fast-wgmma-score] [--json FILE]
"""

import sys


def _arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    from indexer import bench

    batches = _arg("--batches", "1,2,4,8,16,32,64").split(",")
    entries, E, top_k = _arg("--entries", "262144"), _arg("--E", "64"), _arg("--k", "1024")
    paths = _arg("--paths", "fast,fast-score,fast-ws,fast-ws-score,fast-wgmma,fast-wgmma-score").split(",")
    # the bench's cases of one's own shape (indexer.bench.CUSTOM_CASE), one a batch size
    bench.run([f"decode-{b}x{entries}-k{top_k}-E{E}" for b in batches], paths, 20, json_path=_arg("--json", None))


if __name__ == "__main__":
    main()
