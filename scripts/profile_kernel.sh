#!/usr/bin/env bash
# Nsight Compute: why a scoring kernel stalls (device only). The .max / .min of the
# per-scheduler counts show whether the schedulers carry even loads; those of the per-SM
# counts (sm__inst_executed) tell how much of that spread lies between SMs, not within one.
#   bash scripts/profile_kernel.sh KERNEL_REGEX CASE PATH OUT_DIR
# e.g. bash scripts/profile_kernel.sh score_wgmma_kernel decode-128K fast-score /tmp
set -euo pipefail
kernel=${1:-score_wgmma_kernel}; case_name=${2:-decode-128K}; path=${3:-fast-score}; out=${4:-.}
stalls=""
for r in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle dispatch_stall \
         no_instruction lg_throttle membar selected not_selected branch_resolving tex_throttle math; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
metrics="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__inst_executed.sum,smsp__inst_executed.max,smsp__inst_executed.min,sm__inst_executed.max,sm__inst_executed.min,smsp__issue_active.max.pct_of_peak_sustained_active,smsp__issue_active.min.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,sm__cycles_elapsed.avg.per_second${stalls}"
ncu --clock-control none -k "regex:${kernel}" -c 1 --metrics "$metrics" \
    python3 scripts/bench.py --cases "$case_name" --paths "$path" --repeats 1 > "$out/ncu_${kernel}_${case_name}.txt" 2>&1 || true
grep -E "^\s+(sm|smsp|gpu|l1tex|lts)__" "$out/ncu_${kernel}_${case_name}.txt" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -50
