#!/usr/bin/env bash
# A hardening round in one `run` call (91 s on an H100 at 300 examples; ~8.5 min at most): the GPU fuzz at INDEXER_FUZZ_EXAMPLES
# examples a test (six tests side by side), the determinism replays and the mixed-shape soak
# (scripts/stress.py), then compute-sanitizer memcheck over scripts/sanitize.py's calls, each
# cut by its own time limit so that the call ends inside the device's. Logs go to $OUT.
#   INDEXER_FUZZ_EXAMPLES=400 bash exp/hardening_round.sh
set -uo pipefail
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
export INDEXER_FUZZ_EXAMPLES=${INDEXER_FUZZ_EXAMPLES:-400}
date -u +%H:%M:%S
timeout 210 python -m pytest -n 6 -o addopts="" -p no:cacheprovider -q --durations=6 tests/test_cuda_fuzz.py \
    > "$out/fuzz.log" 2>&1; echo "fuzz rc=$?"
tail -12 "$out/fuzz.log"
date -u +%H:%M:%S
timeout 150 python scripts/stress.py --replays 100 --soak 4000 > "$out/stress.log" 2>&1; echo "stress rc=$?"
tail -15 "$out/stress.log"
date -u +%H:%M:%S
timeout 150 python scripts/sanitize.py --tools memcheck > "$out/sanitize.log" 2>&1; echo "memcheck rc=$?"
tail -15 "$out/sanitize.log"
date -u +%H:%M:%S
