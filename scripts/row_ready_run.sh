#!/usr/bin/env bash
# exp-row-ready's first GPU round (device only), one command:
#   bash scripts/row_ready_run.sh "$OUT"
# the GPU tests the branch touches, the sanitizers, and a one-process A/B of the row select
# started on each row's count against the same select waiting for the whole dense kernel
# first (the launch code passes the counts to both; the grid-wait version still clears them),
# with its rows' loads through L2 as the branch has them and through the read-only path.
set -uo pipefail
out=${1:-.}
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p abv
python3 - <<'PY'
s = open("kernels/select_fast.cu").read()
old = """    if (row_ready == nullptr) {
        wait_for_previous_grid();  // the scores come from the kernel before (common.cuh)
    } else {"""
assert old in s
new = """    wait_for_previous_grid();  // A/B: the whole scoring kernel waited for first
    if (row_ready == nullptr) {
    } else {"""
grid = s.replace(old, new)
open("abv/select_grid.cu", "w").write(grid)
# ... and with the row's loads through the read-only path (main's select exactly): the
# header inlined with __ldg back in place of __ldcg, to see what the L2 loads cost alone
header = open("kernels/select_row.cuh").read().replace("__ldcg(", "__ldg(")
assert '#include "select_row.cuh"' in grid
open("abv/select_grid_ldg.cu", "w").write(grid.replace('#include "select_row.cuh"', header))
PY
timeout 200 python3 -m pytest tests/test_cuda_row_ready.py tests/test_cuda_row_select.py tests/test_cuda_dense.py \
    tests/test_cuda_pdl.py tests/test_cuda_counters_at_rest.py 2>&1 | tee "$out/tests.txt" | tail -15
timeout 60 python3 scripts/sanitize.py 2>&1 | tee "$out/sanitize.txt" | tail -4
timeout 150 python3 scripts/ab_kernels.py --source select_fast.cu --case prefill-8K --against abv/select_grid.cu \
    --against abv/select_grid_ldg.cu --rounds 5 2>&1 | tee "$out/ab.txt" | tail -4
