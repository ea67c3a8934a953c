"""Which library an array belongs to, decided without importing CuPy or PyTorch."""

import numpy as np
import pytest

from indexer import arrays


class FakeDLPack:
    """An object that speaks DLPack, living on the device type given."""

    def __init__(self, dev_type):
        self.dev_type = dev_type

    def __dlpack_device__(self):
        return (self.dev_type, 0)


class BrokenDLPack:
    def __dlpack_device__(self):
        raise RuntimeError("no device")


class FakeCAI:
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


@pytest.mark.parametrize("obj,on_device", [
    (np.zeros(3, np.float32) + 1, False),
    (FakeDLPack(1), False),    # kDLCPU
    (FakeDLPack(2), True),     # kDLCUDA
    (FakeDLPack(13), True),    # kDLCUDAManaged
    (BrokenDLPack(), False),
    (FakeCAI(), True),
    ([1.0, 2.0], False),
])
def test_is_device_array(obj, on_device):
    assert arrays.is_device_array(obj) is on_device


def test_numpy_inputs_stay_with_numpy():
    x = np.arange(4, dtype=np.float32)
    assert arrays.module_of(x, x) is np
    assert arrays.framework_of(x) == "numpy"
    assert arrays.framework_of([1, 2]) == "numpy"
    assert arrays.framework_of(FakeDLPack(2)) == "other"
    # JAX's arrays live in jaxlib (jax.Array's implementation); results go back as JAX arrays
    FakeJax = type("ArrayImpl", (), {"__module__": "jaxlib.xla_extension"})
    assert arrays.framework_of(FakeJax()) == "jax"
    assert not arrays.is_cupy(x)
    assert arrays.to_numpy(x) is x
    np.testing.assert_array_equal(arrays.to_numpy([1.5, 2.5]), np.array([1.5, 2.5]))


def test_gpu_available_is_a_bool_and_cached():
    assert isinstance(arrays.gpu_available(), bool)
    assert arrays.cupy() is arrays.cupy()


def _fake_cupy(capability_of):
    """A stand-in for the CuPy module whose devices report ``capability_of[id]`` ("75", "90")."""
    import types

    class Device:
        def __init__(self, device_id=None):
            self.compute_capability = capability_of[0 if device_id is None else device_id]

    return types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device))


def test_compute_capability_and_the_oldest_gpu_the_kernels_take(monkeypatch):
    monkeypatch.setattr(arrays, "cupy", lambda: None)
    assert arrays.compute_capability() is None and not arrays.gpu_supported()
    monkeypatch.setattr(arrays, "cupy", lambda: _fake_cupy({0: "75", 1: "80", 2: "90", 3: "100", 4: "120"}))
    assert [arrays.compute_capability(i) for i in range(5)] == [(7, 5), (8, 0), (9, 0), (10, 0), (12, 0)]
    assert arrays.compute_capability() == (7, 5)  # the current device
    assert [arrays.gpu_supported(i) for i in range(5)] == [False, True, True, True, True]
    assert not arrays.gpu_supported()


def test_auto_backend_keeps_host_arrays_off_a_gpu_the_kernels_cannot_run_on(monkeypatch):
    # a T4 (compute capability 7.5): CuPy sees it, the kernels need sm_80; the NumPy backend
    # scores host arrays there (an explicit backend='cuda' is refused by name on the GPU path)
    from indexer import ops

    host = (np.ones((1, 2, 32), np.float32), np.ones((1, 2), np.float32))
    monkeypatch.setattr(arrays, "cupy", lambda: _fake_cupy({0: "75"}))
    assert arrays.gpu_available()
    assert ops._pick_backend("auto", host) == "numpy"
    assert ops._pick_backend("cuda", host) == "cuda"
    monkeypatch.setattr(arrays, "cupy", lambda: _fake_cupy({0: "90"}))
    assert ops._pick_backend("auto", host) == "cuda"
    monkeypatch.setattr(arrays, "cupy", lambda: None)
    assert ops._pick_backend("auto", host) == "numpy"


@pytest.mark.skipif(arrays.gpu_available(), reason="checks the message shown where no GPU is usable")
def test_to_cupy_without_gpu_says_what_is_missing():
    with pytest.raises(RuntimeError, match="CuPy and a CUDA GPU"):
        arrays.to_cupy(np.ones(2, np.float32))


def test_importing_the_package_imports_no_gpu_library():
    import subprocess
    import sys

    code = ("import sys, indexer, indexer.cli, indexer.pool, indexer.io; "
            "bad = [m for m in ('cupy', 'torch', 'jax') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tensors_of_torch_are_found_among_the_inputs(monkeypatch):
    """``arrays.any_torch`` and ``streams._has_torch`` tell PyTorch's objects by their type's
    module (PyTorch itself is never imported): none among NumPy arrays and scalars, found
    among them once one is there, and PyTorch's module returned only while it is loaded."""
    import sys
    import types

    from indexer import streams

    class FakeTensor:  # a class of PyTorch's, by its module's name
        pass

    FakeTensor.__module__ = "torch.fake"
    plain = [np.zeros(2), 3, 2.5, (1, 2)]
    assert not arrays.any_torch(plain) and arrays.any_torch(plain + [FakeTensor()])
    assert arrays.framework_of(FakeTensor()) == "torch" and arrays.framework_of(True) == "numpy"
    fake_torch = types.ModuleType("torch")
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert streams._has_torch(plain) is None
    assert streams._has_torch(plain + [FakeTensor()]) is fake_torch
    monkeypatch.delitem(sys.modules, "torch")
    assert streams._has_torch(plain + [FakeTensor()]) is None


def test_a_device_array_off_its_element_alignment_is_refused_by_name():
    """A misaligned load faults and ends the CUDA context: refused before any launch, by name
    (a stand-in for a CuPy array cut at an odd byte offset; host arrays pass: they are copied)."""
    class Pointer:
        def __init__(self, ptr):
            self.ptr = ptr

    class DeviceArray:
        def __init__(self, ptr, dtype):
            self.data, self.dtype = Pointer(ptr), np.dtype(dtype)

    arrays.check_element_aligned("w", DeviceArray(0x7000_0000_0004, np.float32))
    arrays.check_element_aligned("q", DeviceArray(0x7000_0000_0002, np.float16))
    with pytest.raises(ValueError, match=r"^w: expected a device array aligned to its 4-byte elements"):
        arrays.check_element_aligned("w", DeviceArray(0x7000_0000_0002, np.float32))
    with pytest.raises(ValueError, match=r"^q: .* 2-byte elements, got one at address 0x700000000001"):
        arrays.check_element_aligned("q", DeviceArray(0x7000_0000_0001, np.float16))
    arrays.check_element_aligned("w", np.frombuffer(bytes(9), np.uint8)[1:].view(np.float32)[:1])


def test_dtype_names_are_kept_by_identity_and_stay_right():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    dtypes = [np.float32, np.float16, np.int32, np.uint8, ">f4", ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn]
    for _ in range(2):  # the second round reads the kept names
        for dt in dtypes:
            x = rng.standard_normal(4).astype(dt)
            assert arrays.dtype_name(x) == str(np.dtype(dt))
    # dtypes made afresh each time (not NumPy's singletons), past the cache's size: each named
    # right, the cache bounded
    for i in range(600):
        dt = np.dtype([("a", np.float32), (f"b{i % 3}", np.int8)])
        assert arrays.dtype_name(np.ones(1, dt)) == str(dt).rpartition(".")[2]
    assert len(arrays._DTYPE_NAMES) <= arrays._DTYPE_NAMES_MAX


class _FlaggedArray:
    """What CuPy's ndarray offers: its own contiguity flag beside ``flags``."""

    def __init__(self, own, flags):
        self._c_contiguous = own
        self.flags = flags


def test_c_contiguous_reads_the_arrays_own_flag_where_it_has_one():
    a = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    assert arrays.c_contiguous(a) and not arrays.c_contiguous(a[:, ::2]) and not arrays.c_contiguous(a.T)
    # the array's own flag decides where it has one (the Flags object is not built)
    assert not arrays.c_contiguous(_FlaggedArray(False, a.flags))
    assert arrays.c_contiguous(_FlaggedArray(True, a[:, ::2].flags))
    # anything but a bool there (another library's method of that name, say) is not a flag
    assert not arrays.c_contiguous(_FlaggedArray(lambda: True, a[:, ::2].flags))
    assert arrays.c_contiguous(_FlaggedArray(1, a.flags))
