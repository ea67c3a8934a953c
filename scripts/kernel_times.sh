#!/usr/bin/env bash
# Nsight Compute: device time of every kernel of one warm call (device only).
#   bash scripts/kernel_times.sh CASE [KERNELS_PER_CALL]
# e.g. bash scripts/kernel_times.sh decode-latency 3
# KERNELS_PER_CALL: launches of the indexer's kernels in one call: per run of rows, query
# staging (not for the kernels that stage their own: warp-specialised, pairs, dense),
# scoring, filter and rank (decode: 4, or 3 at batch 1), or for grouped calls the pair
# kernel and the one-CTA-per-row select (mtp-2: 3 with its filter and rank), the dense
# kernel's key image, scoring and select (prefill-8K: 3), the keys-stationary kernel's two
# staging passes, scoring, histogram, filter and rank (prefill-chunk: 6 a run, 19 runs);
# e.g. decode-latency 3, decode-1M 8 (2 runs). The first three calls are skipped
# (compilation, CuPy's pool).
set -euo pipefail
case_name=${1:?case}; k=${2:-4}
ncu --clock-control none -k "regex:score_|topk_|prep_query|ks_restage|dense_keys" --launch-skip $((3 * k)) --launch-count "$k" \
    --metrics gpu__time_duration.sum python3 "$(dirname "$0")/kernel_times.py" "$case_name" 2>&1 \
  | grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" | sed -E 's/\(.*//; s/gpu__time_duration.sum//; s/ +/ /g' \
  | paste - - | sed "s/^/$case_name: /"
