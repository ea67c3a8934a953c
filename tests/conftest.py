import os
import zlib

# Under pytest-xdist, one BLAS thread a worker: the reference's per-row float64 products
# are small, and eight workers each running a 16-thread BLAS on 16 cores made one checked
# test take 209 s instead of ~5 (set before NumPy loads its BLAS, which reads these once).
# Set, not defaulted: a count the environment names for the whole machine would otherwise
# reach every worker.
_XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))
if _XDIST_WORKER:
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_name] = "1"

import numpy as np  # noqa: E402
import pytest


def _one_openblas_thread():
    """Set the OpenBLAS that NumPy loaded to one thread at run time (its own API, found in
    the process's mapped libraries; Linux only): the variables above act only if NumPy
    loads after this file, and a plugin or an earlier import may have loaded it first."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return
    for path in paths:
        try:
            lib = ctypes.CDLL(path)  # already loaded: the same library, not a second copy
        except OSError:
            continue
        for symbol in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                       "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(lib, symbol):
                getattr(lib, symbol)(1)
                break


if _XDIST_WORKER:
    _one_openblas_thread()


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the test's node id: reproducible and distinct per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
