#!/usr/bin/env bash
# Nsight Compute: device time of every kernel of one warm call (device only).
#   bash scripts/kernel_times.sh CASE [KERNELS_PER_CALL]
# e.g. bash scripts/kernel_times.sh decode-latency 5
# KERNELS_PER_CALL: launches of the indexer's kernels in one call (prep, score, filter,
# rank, final = 5 per run of rows, 4 where the candidates are sorted without ranking; 3 with
# the one-CTA-per-row select); the first three calls are skipped (compilation, CuPy's pool).
set -euo pipefail
case_name=${1:?case}; k=${2:-5}
ncu --clock-control none -k "regex:score_|topk_|prep_query" --launch-skip $((3 * k)) --launch-count "$k" \
    --metrics gpu__time_duration.sum python3 "$(dirname "$0")/kernel_times.py" "$case_name" 2>&1 \
  | grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" | sed -E 's/\(.*//; s/gpu__time_duration.sum//; s/ +/ /g' \
  | paste - - | sed "s/^/$case_name: /"
