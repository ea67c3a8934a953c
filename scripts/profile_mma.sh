#!/usr/bin/env bash
# Nsight Compute profile of the tensor-core scoring kernel on one benchmark case (device only).
#   bash scripts/profile_mma.sh decode-128K out_dir
set -euo pipefail
case_name=${1:-decode-128K}
out=${2:-.}
ncu --clock-control none -k regex:score_mma_kernel -c 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats \
    python3 scripts/bench.py --cases "$case_name" --paths fast-score --repeats 1 > "$out/ncu_$case_name.txt" 2>&1 || true
grep -E "Duration|Throughput|Achieved Occupancy|Registers|Issue Slots|Eligible|No Eligible|Stall|Warp Cycles|Theoretical Occupancy|Block Limit|Executed Ipc|Pipe" "$out/ncu_$case_name.txt" | head -60
