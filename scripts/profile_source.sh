#!/usr/bin/env bash
# Nsight Compute, instruction level: where a scoring kernel's warps stall (device only).
#   bash scripts/profile_source.sh KERNEL_REGEX CASE PATH OUT_DIR
# e.g. bash scripts/profile_source.sh score_wgmma_kernel decode-128K fast-score "$OUT"
# Writes OUT_DIR/sass_KERNEL.csv: one row per SASS instruction with its executed count and
# sampled stall reasons, to read on a machine without a GPU (sort by the stall columns).
set -euo pipefail
kernel=${1:-score_wgmma_kernel}; case_name=${2:-decode-128K}; path=${3:-fast-score}; out=${4:-.}
rep="$out/profile_${kernel}"
ncu --clock-control none -k "regex:${kernel}" -c 1 --section SourceCounters --section WarpStateStats \
    --import-source no -f -o "$rep" \
    python3 scripts/bench.py --cases "$case_name" --paths "$path" --repeats 1 > "$out/ncu_source_${kernel}.log" 2>&1 || true
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$out/sass_${kernel}.csv" 2>>"$out/ncu_source_${kernel}.log" || true
rm -f "$rep.ncu-rep"
wc -l "$out/sass_${kernel}.csv"
