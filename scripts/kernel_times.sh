#!/usr/bin/env bash
# Nsight Compute: device time of every kernel of one warm call (device only).
#   bash scripts/kernel_times.sh CASE [KERNELS_PER_CALL]
# e.g. bash scripts/kernel_times.sh decode-latency 3
# KERNELS_PER_CALL: launches of the indexer's kernels in one call: per run of rows, query
# staging (not for the warp-specialised kernel, which stages its own), scoring, filter and
# rank (decode: 4, or 3 at batch 1), or staging, scoring and the one-CTA-per-row select
# (prefill: 3); e.g. decode-latency 3, decode-1M 8 (2 runs), prefill-8K 12 (4 runs). The
# first three calls are skipped (compilation, CuPy's pool).
set -euo pipefail
case_name=${1:?case}; k=${2:-4}
ncu --clock-control none -k "regex:score_|topk_|prep_query" --launch-skip $((3 * k)) --launch-count "$k" \
    --metrics gpu__time_duration.sum python3 "$(dirname "$0")/kernel_times.py" "$case_name" 2>&1 \
  | grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" | sed -E 's/\(.*//; s/gpu__time_duration.sum//; s/ +/ /g' \
  | paste - - | sed "s/^/$case_name: /"
