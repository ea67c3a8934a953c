#!/usr/bin/env bash
# v103's device round for the split pair calls (lone rows in a launch of their own), in one
# `run` call: memcheck over the split tests, a one-process A/B of the split against the
# pair's form (scripts/ab_flags.py), exp/mtp_n.py (1, 3 and 5 rows a request: the default
# path against rows one at a time), then main's whole GPU suite (exp/device_round.sh).
#   bash exp/split_round.sh
set -uo pipefail
export PYTHONPATH=.
out=${OUT:-/tmp}
compute-sanitizer --tool memcheck --error-exitcode 9 python -m pytest -o addopts="" -p no:cacheprovider -q \
    tests/test_cuda_claimed_shares.py -k "split or lone" > "$out/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -2 "$out/memcheck.log"
python scripts/ab_flags.py --cases mtp-3,mtp-2,mtp-4 --variant _PAIRS_SPLIT=False --rounds 4 > "$out/ab.log" 2>&1
tail -16 "$out/ab.log"
python exp/mtp_n.py --rows 1,3,5 --json "$out/mtp_n.json" 2>&1 | grep -v "^  (" | tail -13
bash exp/device_round.sh
