#!/usr/bin/env bash
# A device round in one `run` call: main's whole GPU suite under pytest-xdist (each worker
# one BLAS thread: tests/conftest.py), then the tests that time the GPU (marked exclusive)
# alone. ~5.5 min on an H100 in the seventy-second session (one test then took 209 s of it:
# the BLAS threads, since mended).
#   bash exp/device_round.sh
set -uo pipefail
export PYTHONPATH=.
opts=(-o addopts="" -p no:cacheprovider -q)
python -m pytest -n 8 -m "not exclusive" "${opts[@]}" --durations=15 tests 2>&1 | tail -40
python -m pytest -m exclusive "${opts[@]}" tests 2>&1 | tail -8
