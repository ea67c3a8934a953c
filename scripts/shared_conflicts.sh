#!/usr/bin/env bash
# Nsight Compute: each kernel of one warm call, its time, shared-memory wavefronts and how
# many of them were bank conflicts, instructions and issue activity (device only).
#   bash scripts/shared_conflicts.sh CASE [KERNELS_PER_CALL]
# e.g. bash scripts/shared_conflicts.sh prefill-8K 3
# KERNELS_PER_CALL as scripts/kernel_times.sh takes it. The MMAs' operand reads count among
# the wavefronts, never among the conflicts; a kernel with many conflicts is then located
# instruction by instruction with scripts/profile_source.sh (its "L1 Wavefronts Shared
# Excessive" column), as docs/performance.md v52 did.
set -euo pipefail
case_name=${1:?case}; k=${2:-4}
metrics=gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
ncu --clock-control none -k "regex:score_|topk_|prep_query|ks_|dense_keys" --launch-skip $((3 * k)) --launch-count "$k" \
    --metrics "$metrics" python3 "$(dirname "$0")/kernel_times.py" "$case_name" 2>&1 \
  | grep -E "^  [a-zA-Z_].*\(|gpu__time|bank_conflicts|wavefronts|inst_executed|issue_active" \
  | sed -E 's/\(const.*//; s/ +/ /g; s/^ //' | sed "s/^/$case_name: /"
