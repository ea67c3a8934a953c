#!/usr/bin/env bash
# A device round in one `run` call: main's whole GPU suite under pytest-xdist (each worker
# one BLAS thread: tests/conftest.py), then the tests that time the GPU (marked exclusive)
# alone. ~1.7 min on an H100 in the eighty-sixth session (87 s + 11 s; 326 s and more before
# each worker's BLAS was held to one thread, performance.md v98). Each run's whole output
# goes to $OUT/suite_*.log as it comes (a call cut by its time limit still brings back how far it got: in the seventy-
# ninth session a cut run inside a 340 s limit left nothing, its output held by `tail`).
#   bash exp/device_round.sh
set -uo pipefail
export PYTHONPATH=.
out=${OUT:-/tmp}
opts=(-o addopts="" -p no:cacheprovider -q)
python -m pytest -n 8 -m "not exclusive" "${opts[@]}" --durations=15 tests > "$out/suite_xdist.log" 2>&1
tail -40 "$out/suite_xdist.log"
python -m pytest -m exclusive "${opts[@]}" tests > "$out/suite_exclusive.log" 2>&1
tail -8 "$out/suite_exclusive.log"
