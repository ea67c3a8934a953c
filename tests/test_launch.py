"""indexer.launch's argument layout, without a GPU: each kernel argument becomes the C
value CuPy would pass (NumPy scalars by their dtype, Python ints as 64-bit integers)."""

import ctypes

import numpy as np
import pytest

from indexer import launch


@pytest.mark.parametrize("value,ctype,expected", [
    (np.int32(-7), ctypes.c_int32, -7),
    (np.int64(1 << 40), ctypes.c_int64, 1 << 40),
    (np.uint32(3_000_000_000), ctypes.c_uint32, 3_000_000_000),
    (np.float32(0.1), ctypes.c_float, float(np.float32(0.1))),
    (0, ctypes.c_int64, 0),  # a null pointer argument, as the launches pass it
    (None, ctypes.c_void_p, None),
])
def test_arguments_take_the_c_type_cupy_would_pass(value, ctype, expected):
    c = launch._c_argument(value)
    assert ctypes.sizeof(c) == ctypes.sizeof(ctype)
    assert type(c).__name__ == ctype.__name__ or isinstance(c, ctype)
    assert c.value == expected


@pytest.mark.parametrize("bad", [True, "3", [1]])
def test_other_arguments_are_refused_by_name(bad):
    with pytest.raises(TypeError, match="kernel argument"):
        launch._c_argument(bad)


def test_the_config_struct_has_the_drivers_layout():
    # cuda.h: CUlaunchConfig is 6 + 1 uints, a stream, an attribute pointer and a uint;
    # CUlaunchAttribute is an id padded to 8 bytes and a 64-byte value
    assert ctypes.sizeof(launch._Attr) == 72
    assert launch._Config.stream.offset == 32 and launch._Config.attrs.offset == 40
    assert ctypes.sizeof(launch._Config) == 56
