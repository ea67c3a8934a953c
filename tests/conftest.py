import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the test's node id: reproducible and distinct per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
