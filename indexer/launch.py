"""Kernel launches that overlap the previous kernel's tail (programmatic dependent launch).

A call's select kernels each read what the kernel before them on the stream wrote, and the
wgmma scoring kernels (single-query and pairs) read the query images their prep kernel wrote. Launched
the ordinary way, each starts only after its predecessor's end has been signalled and the
new launch processed. Launched with CUDA's programmatic-stream-serialization attribute
(sm_90+; CUDA driver 12.3+ for CUDA graphs), its CTAs are placed as soon as every CTA of the
predecessor has exited or triggered (``let_next_grid_start``), and each waits for the
predecessor's writes to be visible (``wait_for_previous_grid``, kernels/common.cuh) before
it touches anything the predecessor writes: the select kernels as their first statement,
the single-query scoring kernel after scheduling its tiles and starting its key copies, the
pair kernel's issuing warp before its first query copies (their prep kernel triggers at its
start). The same bits either way; ~0.75 us less a call at batch 1
(two such edges, docs/performance.md v26), 1-2 us less a run of the decode cases' scoring
(v28), measured in CUDA graphs on the H200. Stream capture records the attribute as a
programmatic edge.
It is used only while the stream is being captured: eager calls are bound by Python's
launch overhead, and this launch path costs more of it than CuPy's.

CuPy launches through ``cuLaunchKernel``, which takes no attributes, so ``after_previous``
calls the driver's ``cuLaunchKernelEx`` itself (ctypes, on the ``CUfunction`` CuPy compiled
and the current CuPy stream), with the arguments laid out as CuPy lays them out: device
arrays as pointers, NumPy scalars as their C type, Python ints as 64-bit integers. Where the
driver or the device lacks the feature, or ``INDEXER_PDL=0`` is set, it is an ordinary
CuPy launch.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct

import numpy as np

from . import arrays, streams

__all__ = ["after_previous", "enabled"]

# cuda.h: CUlaunchAttributeID
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_MIN_DRIVER = 12030  # stream capture of the attribute into graphs


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("programmatic", ctypes.c_int)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint)]


def _programmatic_attribute():
    attr = _Attr(id=_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value.programmatic = 1
    return ctypes.pointer(attr)


_PROGRAMMATIC = _programmatic_attribute()  # read-only, shared by every launch


@functools.cache
def _driver():  # gpu-only
    """libcuda's cuLaunchKernelEx and cuGetErrorString, or None where it has no such entry
    point or is older than _MIN_DRIVER."""
    try:
        lib = ctypes.CDLL("libcuda.so.1" if os.name != "nt" else "nvcuda.dll")
        launch = lib.cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value < _MIN_DRIVER:
        return None
    launch.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    launch.restype = ctypes.c_int
    return launch, lib.cuGetErrorString


@functools.cache
def _device_ok(device_id: int) -> bool:  # gpu-only
    cp = arrays.cupy()
    return int(cp.cuda.Device(device_id).compute_capability) >= 90


def enabled(device_id: int) -> bool:  # gpu-only
    """Whether launches on this device may overlap their predecessor (see the module doc)."""
    return os.environ.get("INDEXER_PDL", "1") != "0" and _device_ok(device_id) and _driver() is not None


# each kernel argument in an 8-byte slot: the struct code of the C type CuPy passes for a
# NumPy scalar of each type (little-endian, a 4-byte value padded to its slot)
_SLOT_CODES = {np.int32: "i4x", np.uint32: "I4x", np.int64: "q", np.uint64: "Q", np.float32: "f4x",
               np.float64: "d"}


def _argument_slot(x):
    """(struct code, value) of ``x`` as CuPy would pass it to a kernel: device arrays as
    pointers, NumPy scalars as their C type, Python ints as 64-bit integers."""
    code = _SLOT_CODES.get(type(x))
    if code is not None:
        return code, x.item()
    if arrays.is_cupy(x):
        return "Q", x.data.ptr
    if x is None:
        return "Q", 0
    if isinstance(x, np.generic):
        raise TypeError(f"kernel argument of dtype {x.dtype}: expected a 32/64-bit integer or float")
    if isinstance(x, bool):
        raise TypeError("kernel argument: pass a NumPy bool_ or int, not a Python bool")
    if isinstance(x, int):
        return "q", x
    if isinstance(x, float):
        return "d", x
    raise TypeError(f"kernel argument of type {type(x).__name__}: expected a CuPy array or a scalar")


def _pack_arguments(args):
    """(buffer, address of its pointer array): ``cuLaunchKernelEx``'s ``kernelParams`` in
    one buffer, n pointers followed by the n arguments' 8-byte slots that they address,
    written by one ``struct.pack_into``. An eager call pays this for each select launch
    (a few microseconds), so it avoids a ctypes object per argument."""
    n = max(1, len(args))
    buf = ctypes.create_string_buffer(16 * n)
    base = ctypes.addressof(buf)
    codes, values = [f"<{n}Q"], list(range(base + 8 * n, base + 16 * n, 8))
    for x in args:
        code, value = _argument_slot(x)
        codes.append(code)
        values.append(value)
    struct.pack_into("".join(codes), buf, 0, *values)
    return buf, base


_FUNCTIONS = {}  # (id(kernel), device id) -> (kernel, its CUfunction): _jit keeps kernels for good


def _function_pointer(kernel, device_id):  # gpu-only
    held = _FUNCTIONS.get((id(kernel), device_id))
    if held is None or held[0] is not kernel:
        held = _FUNCTIONS[(id(kernel), device_id)] = (kernel, kernel.kernel.ptr)
    return held[1]


def after_previous(kernel, device_id, grid, block, args, shared_mem=0):  # gpu-only
    """Launch CuPy ``RawKernel`` ``kernel`` like ``kernel(grid, block, args, shared_mem=...)``
    on the current stream; while the stream is being captured into a CUDA graph, allowed to
    start under the previous kernel's tail (the kernel must call ``wait_for_previous_grid()``
    before it reads or writes anything the previous kernel writes or reads, and the previous
    kernel must have been launched the ordinary way if it does anything before that call).
    ``grid`` and ``block``: tuples of up to 3."""
    cp = arrays.cupy()
    stream = cp.cuda.get_current_stream()
    # only into CUDA graphs: there the launch is paid once, at capture; an eager call is
    # bound by Python's launch overhead, where the ctypes path costs ~40 us a launch more
    # than CuPy's (measured on the H200's host) and the overlap gains nothing. The capture
    # state first (0.16 us; `enabled` reads the environment, 0.6 us); `_driver` loads
    # the driver entry point at the first eager call, not mid-capture; a failed
    # capture-state query takes the ordinary launch, which reports what is wrong.
    _driver()
    if not (streams.capture_state(stream)[0] and enabled(device_id)):
        kernel(grid, block, args, shared_mem=shared_mem)
        return
    launch, error_string = _driver()
    grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
    config = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), int(shared_mem),
                     stream.ptr, _PROGRAMMATIC, 1)
    buf, params = _pack_arguments(args)  # buf: the storage params point into, alive until the launch
    rc = launch(ctypes.byref(config), _function_pointer(kernel, device_id), params, None)
    if rc != 0:
        text = ctypes.c_char_p()
        error_string(rc, ctypes.byref(text))
        raise RuntimeError(f"cuLaunchKernelEx of {kernel.name}: CUDA error {rc} "
                           f"({(text.value or b'?').decode()})")
