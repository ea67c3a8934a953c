#!/usr/bin/env bash
# The device round of docs/performance.md item 0 (v83), one `run` call a part (the device
# copies the working tree, not the repository: the branches travel as patches).
#   bash exp/device_round_v83.sh suite      # main's whole GPU suite (xdist, then the exclusive tests)
#   bash exp/device_round_v83.sh branches   # fix-pool-stream and fix-ws-retire applied, their tests
# Patches: git diff main fix-pool-stream > exp/patches/fix-pool-stream.patch (likewise
# fix-ws-retire); both apply to main together.
set -uo pipefail
export PYTHONPATH=.
opts=(-o addopts="" -p no:cacheprovider -q)
case "${1:-}" in
suite)
    python -m pytest -n 8 -m "not exclusive" "${opts[@]}" --durations=30 tests 2>&1 | tail -60
    python -m pytest -m exclusive "${opts[@]}" tests 2>&1 | tail -8
    ;;
branches)
    patch -p1 -s < exp/patches/fix-pool-stream.patch || exit 1
    patch -p1 -s < exp/patches/fix-ws-retire.patch || exit 1
    python -m pytest -n 8 "${opts[@]}" tests/test_cuda_pool.py tests/test_pool.py tests/test_cuda_out_workspace.py \
        tests/test_cuda_prepared.py tests/test_cuda_torch.py tests/test_cuda_torch_ops.py tests/test_cuda_launch_plan.py \
        2>&1 | tail -30
    ;;
*)
    echo "usage: bash exp/device_round_v83.sh suite|branches" >&2
    exit 2
    ;;
esac
