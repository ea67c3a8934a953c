"""Shared skip rule of the GPU tests: they run where CuPy sees a CUDA device, else skip."""

import pytest

from indexer import arrays

requires_gpu = pytest.mark.skipif(not arrays.gpu_available(), reason="needs CuPy and a CUDA GPU")
