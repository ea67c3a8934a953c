#!/usr/bin/env bash
# v87's review fixes to Workspace.turn, in one `run` call (~3 min on an H100): the tests of
# the workspace, prepared calls and PyTorch operators, then every turn test with the turn
# switched off and on (each must differ off and never on), then the turn's host cost.
#   bash exp/turn_round.sh
set -uo pipefail
export PYTHONPATH=.
python -m pytest -o addopts="" -p no:cacheprovider -q -n 8 tests/test_cuda_workspace_turns.py \
    tests/test_cuda_out_workspace.py tests/test_cuda_prepared.py tests/test_cuda_torch_ops.py 2>&1 | tail -4
python -W ignore exp/turn_off_race.py 2>/dev/null | grep differed
python exp/turn_cost.py 2>&1 | tail -2
