import os
import zlib

# Under pytest-xdist, one BLAS thread a worker: the reference's per-row float64 products
# are small, and eight workers each running a 16-thread BLAS on 16 cores made one checked
# test take 209 s instead of ~5 (set before NumPy loads its BLAS, which reads these once).
# Set, not defaulted: a count the environment names for the whole machine would otherwise
# reach every worker.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_name] = "1"

import numpy as np  # noqa: E402
import pytest


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the test's node id: reproducible and distinct per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
