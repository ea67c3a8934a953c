#!/usr/bin/env bash
# Why test_row_pairs_share_key_tiles_and_match_single_rows[counts5] takes ~110-210 s in the
# GPU suite under xdist: (1) its calls and check timed alone; (2) whether NumPy is loaded in
# an xdist worker before tests/conftest.py sets one BLAS thread; (3) the test file alone
# under eight workers.
set -uo pipefail
export PYTHONPATH=$PWD
date -u +%H:%M:%S
env | grep -E "THREADS|OMP|BLAS|MKL" || echo "no thread counts in the environment"
nproc
python exp/slow_test_probe.py 2>&1 | tail -20
python - <<'PY'
import numpy, sys
try:
    from numpy import show_runtime
    show_runtime()
except Exception as exc:
    print("no show_runtime", exc)
PY
cp tests/conftest.py /tmp/conftest.py.kept
trap 'cp /tmp/conftest.py.kept tests/conftest.py' EXIT  # restored even if the run is cut short
sed -i '1i import sys as _s, os as _o; open("/tmp/np_loaded_%d" % _o.getpid(), "w").write(str("numpy" in _s.modules) + " " + str(_o.environ.get("PYTEST_XDIST_WORKER")) + " " + str(_o.environ.get("OPENBLAS_NUM_THREADS")) + "/" + str(_o.environ.get("OMP_NUM_THREADS")) + " " + ",".join(sorted(m for m in _s.modules if m.split(".")[0] in ("numpy", "torch", "cupy", "scipy")))[:300] + "\n")' tests/conftest.py
rm -f /tmp/np_loaded_*
python -m pytest -n 8 -o addopts="" -p no:cacheprovider -q --durations=8 tests/test_cuda_ragged.py 2>&1 | tail -14
head -c 400 /tmp/np_loaded_*
date -u +%H:%M:%S
