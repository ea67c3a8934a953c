#!/usr/bin/env bash
# The replay path's host time, HEAD's tree (exp/_old: `git archive <rev> indexer kernels |
# tar -x -C exp/_old`) against the working tree, alternating processes three times each.
#   bash exp/replay_ab.sh
set -uo pipefail
for i in 1 2; do
  for tree in exp/_old .; do
    echo "== $tree"
    PYTHONPATH=$tree python exp/replay_parts.py 2>&1 | tail -16
  done
done
