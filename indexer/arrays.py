"""Which array library an input belongs to, and moving arrays between host and device.

NumPy is always there; CuPy is imported lazily, only when a GPU path is asked for or a
device array is seen. PyTorch, JAX and other CUDA arrays enter through DLPack or
``__cuda_array_interface__`` with zero copies and are never imported here (PyTorch tensors
on PyTorch's current stream are viewed from their pointers instead: ``to_cupy``).
"""

from __future__ import annotations

import functools
import sys
from typing import NamedTuple

import numpy as np

__all__ = [
    "cupy",
    "gpu_available",
    "MIN_COMPUTE_CAPABILITY",
    "compute_capability",
    "gpu_supported",
    "is_cupy",
    "is_device_array",
    "check_kinds",
    "check_torch_dtype",
    "torch_refusal",
    "refused",
    "check_element_aligned",
    "ARGUMENT_DTYPES",
    "module_of",
    "to_cupy",
    "Operand",
    "device_operand",
    "QUERY_DTYPES",
    "BITS_DTYPES",
    "c_contiguous",
    "dtype_name",
    "query_to_cupy",
    "query_to_numpy",
    "to_numpy",
    "byte_extent",
    "as_array",
    "framework_of",
    "any_torch",
    "wrap_like",
]


@functools.cache
def cupy():
    """The ``cupy`` module, or None when it is not installed or finds no usable GPU."""
    try:
        import cupy as cp  # noqa: PLC0415  (imported lazily on purpose)

        if cp.cuda.runtime.getDeviceCount() < 1:  # gpu-only
            return None
        return cp  # gpu-only
    except Exception:  # ImportError, CUDARuntimeError (no driver), ...
        return None


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return cupy() is not None


#: the oldest GPUs the CUDA kernels run on: compute capability 8.0 (sm_80, Ampere), the first
#: with the asynchronous copies, the m16n8k16 tensor-core shape and the warp reductions the
#: kernels use. Older ones (a T4 is 7.5) take the NumPy backend under backend='auto'.
MIN_COMPUTE_CAPABILITY = (8, 0)


def compute_capability(device_id=None):
    """(major, minor) of CUDA device ``device_id`` (CuPy's current device when None), or None
    without CuPy or a GPU."""
    cp = cupy()
    if cp is None:
        return None
    n = int(cp.cuda.Device(device_id).compute_capability)  # "75", "90", "100"
    return n // 10, n % 10


def gpu_supported(device_id=None) -> bool:
    """True when CuPy sees a GPU (``device_id``, or its current device) that the CUDA kernels
    run on (``MIN_COMPUTE_CAPABILITY`` or newer)."""
    cc = compute_capability(device_id)
    return cc is not None and cc >= MIN_COMPUTE_CAPABILITY


def is_cupy(x) -> bool:
    # by type, cached (_framework_of_type): every call checks each of its ~7 inputs several times
    return _framework_of_type(type(x)) == "cupy"


def _is_torch_type(t) -> bool:
    return _framework_of_type(t) == "torch"


def is_device_array(x) -> bool:
    """True for arrays living in CUDA device memory (CuPy, PyTorch CUDA tensors, JAX, ...)."""
    if is_cupy(x):
        return True
    if _is_torch_type(type(x)) and hasattr(x, "is_cuda"):  # gpu-only: PyTorch's __dlpack_device__ is Python
        return bool(x.is_cuda)
    if hasattr(x, "__dlpack_device__"):
        try:
            dev_type, _ = x.__dlpack_device__()
        except Exception:
            return False
        return int(dev_type) in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
    return hasattr(x, "__cuda_array_interface__")


#: each array argument's dtype, as the errors name it
ARGUMENT_DTYPES = {"q": "float32, float16, bfloat16 or float8_e4m3fn", "w": "float32", "keys_fp4": "uint8", "key_scale": "uint8",
                   "key_gscale": "float32", "block_table": "int32", "valid_lens": "int32", "cu_seqlens_q": "int32"}


def check_kinds(names, xs, *, in_order=False) -> None:
    """TypeError naming the first of ``xs`` that is neither a NumPy or CuPy array nor a
    DLPack CUDA array (what the GPU path takes), or a PyTorch tensor of a dtype NumPy and
    CuPy lack (``check_torch_dtype``). ``in_order``: also ValueError naming a NumPy array
    that is not C-contiguous, as the NumPy backend refuses it (the GPU path's copy to the
    device would otherwise put it in order unasked)."""
    for name, x in zip(names, xs):
        if isinstance(x, np.ndarray):
            if in_order and not x.flags.c_contiguous:
                raise ValueError(f"{name}: expected a C-contiguous array")
        elif not (is_cupy(x) or is_device_array(x)):
            raise TypeError(f"{name}: expected a NumPy, CuPy or DLPack CUDA array, got {type(x).__name__}")
        check_torch_dtype(name, x)


def check_torch_dtype(name, x) -> None:
    """TypeError naming ``x``, a PyTorch tensor of a dtype NumPy and CuPy cannot hold (a
    bfloat16 ``w``, say), where the conversion would fail with a message of its own that
    names no argument. ``q``'s bfloat16 and float8_e4m3fn are read as their bits (``query_to_cupy``)."""
    if _is_torch_type(type(x)) and not (name == "q" and dtype_name(x) in QUERY_DTYPES):  # gpu-only
        torch = sys.modules["torch"]
        if x.dtype not in _torch_dtypes(torch):
            raise TypeError(f"{name}: expected dtype {ARGUMENT_DTYPES.get(name, 'of NumPy')}, got {x.dtype}")


def torch_refusal(x, *, grad=True, sign=True):
    """Why PyTorch tensor ``x`` (or a tensor subclass of another module's) cannot be read as
    an array: a sparse or nested layout, no data on the meta device, and with ``sign`` a lazy
    negation or conjugation bit, with ``grad`` a gradient to keep (for a caller that reads it
    as it is: one that detaches or resolves first passes False); None where none holds (also
    for anything but a tensor). For errors only: off the hot path."""
    if not hasattr(x, "is_neg") or not hasattr(x, "layout"):
        return None
    torch = sys.modules.get("torch")  # gpu-only below (PyTorch is not a dependency)
    if torch is None:
        return None
    if getattr(x, "is_nested", False):
        return "expected a plain (strided) tensor, got a nested one"
    if x.layout != torch.strided:
        return f"expected a plain (strided) tensor, got layout {x.layout}"
    if x.is_meta:
        return "expected a tensor on the host or a CUDA GPU, got one on 'meta'"
    if sign and x.is_neg():
        return "expected a tensor without a lazy negation bit (pass .resolve_neg())"
    if sign and x.is_conj():
        return "expected a tensor without a lazy conjugation bit (pass .resolve_conj())"
    if grad and x.requires_grad:
        return "expected a tensor that does not require grad (pass .detach())"
    return None


def refused(names, xs, exc, *, grad=True, sign=True):
    """Raise the TypeError naming the first of ``xs`` (PyTorch tensors, by ``names``) that
    ``torch_refusal`` (``grad``, ``sign`` as it takes them) explains, for ``exc``, the error
    a conversion of them raised (call it in ``exc``'s handler; ``exc`` chained as its
    cause); re-raise ``exc`` itself where none does."""
    for name, x in zip(names, xs):
        reason = torch_refusal(x, grad=grad, sign=sign)
        if reason is not None:
            raise TypeError(f"{name}: {reason}") from exc
    raise exc


def _unsigned_view_refused(x):
    """BufferError for a tensor (of PyTorch's or a subclass of another module's) with a lazy
    negation or conjugation bit: DLPack and ``__cuda_array_interface__`` export its memory
    without the sign, which read as it lies would be its negation; None otherwise."""
    is_neg = getattr(x, "is_neg", None)
    if callable(is_neg) and hasattr(x, "is_conj") and (is_neg() or x.is_conj()):
        return BufferError("a tensor with a lazy negation or conjugation bit cannot be read by address")
    return None


def check_element_aligned(name, x) -> None:
    """ValueError naming ``x``, a device array (CuPy) whose address is not a multiple of its
    element size: the kernels load elements whole, and a misaligned load is a fault that
    ends the process's CUDA context, not an error one can catch. (A view cut at an odd byte
    offset of a buffer, e.g. ``cupy.ndarray(..., memptr=buf.data + 1)``.) Host arrays are
    copied to the device, aligned, so they pass."""
    if not isinstance(x, np.ndarray) and x.data.ptr % x.dtype.itemsize:
        raise ValueError(f"{name}: expected a device array aligned to its {x.dtype.itemsize}-byte elements, "
                         f"got one at address {x.data.ptr:#x}")


def module_of(*xs):
    """``cupy`` when any argument is a CuPy array, else ``numpy``."""
    for x in xs:
        if is_cupy(x):  # gpu-only
            return cupy() or _import_cupy_or_fail()
    return np


def _import_cupy_or_fail():  # gpu-only
    import cupy as cp  # noqa: PLC0415

    return cp


def framework_of(x) -> str:
    """'numpy', 'cupy', 'torch', 'jax' or 'other' (another DLPack device array)."""
    return _framework_of_type(type(x))


@functools.lru_cache(maxsize=128)
def _framework_of_type(t) -> str:
    # by type, cached (0.05 us a lookup): a call asks it of each input several times
    mod = t.__module__.split(".")[0]
    if mod in ("numpy", "cupy", "torch"):
        return mod
    if mod in ("jax", "jaxlib"):
        return "jax"
    if issubclass(t, (list, tuple, int, float)):
        return "numpy"
    return "other"


def any_torch(xs) -> bool:
    """Whether a PyTorch tensor (or another object of PyTorch's) is among ``xs``."""
    return any(map(_is_torch_type, map(type, xs)))


#: the query dtypes every path reads as they are (kernels/common.cuh: the kernels' element types)
QUERY_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn")
#: the query dtypes CuPy lacks, by the unsigned integer type of their bits: the CUDA path
#: views such a query as those bits, which the kernels read as the type
#: (``query_to_cupy``; kernels/common.cuh: bf16_bits, e4m3_bits)
BITS_DTYPES = {"bfloat16": "uint16", "float8_e4m3fn": "uint8"}


def dtype_name(x) -> str:
    """The name of array ``x``'s element type, whatever its framework: 'float32', 'float16',
    'bfloat16', 'float8_e4m3fn' (PyTorch's, JAX's, or NumPy's through ml_dtypes), 'int32', ...
    Kept by the dtype object's identity: ``str`` of a NumPy dtype takes ~3 us (Python code in
    NumPy 2), and a call asks it of several arrays."""
    dtype = x.dtype
    held = _DTYPE_NAMES.get(id(dtype))
    if held is not None and held[0] is dtype:
        return held[1]
    name = str(dtype).rpartition(".")[2]
    if len(_DTYPE_NAMES) >= _DTYPE_NAMES_MAX:  # dtypes made afresh each call (not singletons)
        _DTYPE_NAMES.clear()
    _DTYPE_NAMES[id(dtype)] = (dtype, name)  # the object kept: its id is not reused meanwhile
    return name


_DTYPE_NAMES = {}  # id(dtype) -> (dtype, name)
_DTYPE_NAMES_MAX = 256


def c_contiguous(x) -> bool:
    """Whether NumPy or CuPy array ``x`` is C-contiguous: a CuPy array's own flag (a bool
    attribute) where it has one (``x.flags`` builds a Flags object each time, ~1 us)."""
    flag = getattr(x, "_c_contiguous", None)
    return flag if type(flag) is bool else bool(x.flags.c_contiguous)


def query_to_cupy(x, *, ordered=False, arg="q"):  # gpu-only
    """``(view, bits_of)`` of a query ``x`` (or of another array read as its bits, named
    ``arg`` in the errors: write_keys' keys) for the CUDA path: ``(to_cupy(x), None)`` for
    anything but bfloat16 and float8_e4m3fn (its dtype is the view's: the checks refuse all
    but float32 and float16 by name); a bfloat16 or float8_e4m3fn query (a PyTorch tensor,
    or a NumPy array of ml_dtypes' type) as ``(a CuPy array of its bits, the dtype's name)``
    (uint16 or uint8: ``BITS_DTYPES``), since CuPy has neither type: the kernels read those
    bits as the type (``bf16_bits``, ``e4m3_bits``)."""
    name = dtype_name(x) if getattr(x, "dtype", None) is not None else None
    if name not in BITS_DTYPES:
        try:
            return to_cupy(x, ordered=ordered), None
        except (RuntimeError, BufferError) as exc:  # DLPack's refusal of a tensor, naming nothing
            refused((arg,), (x,), exc)
    cp = cupy()
    if cp is None:
        raise RuntimeError("the CUDA backend needs CuPy and a CUDA GPU; neither was found")
    kind = framework_of(x)
    if kind == "torch":
        if x.requires_grad:  # as DLPack refuses any tensor that does
            raise TypeError(f"{arg}: expected a tensor that does not require grad (pass {arg}.detach())")
        try:
            bits = torch_bits(x, name)
        except RuntimeError as exc:  # PyTorch's refusal to view a negated tensor's bits, naming nothing
            refused((arg,), (x,), exc)
    elif isinstance(x, np.ndarray):
        bits = x.view(BITS_DTYPES[name])
    else:
        raise TypeError(f"{arg}: a {name} array of {kind} cannot be read (CuPy has no {name}); pass a PyTorch "
                        "tensor, or float16 or float32")
    return to_cupy(bits, ordered=ordered).view(BITS_DTYPES[name]), name


def torch_bits(x, name):  # gpu-only (PyTorch is not a dependency)
    """A view of PyTorch tensor ``x`` of dtype ``name`` (a ``BITS_DTYPES`` key) as its bits:
    the same memory and strides, in an integer type DLPack, NumPy and CuPy all take."""
    torch = sys.modules["torch"]  # imported: ``x`` is its tensor
    return x.view(torch.int16 if BITS_DTYPES[name] == "uint16" else torch.uint8)


def to_cupy(x, dtype=None, *, ordered=False):
    """A CuPy view of a device array (zero copy) or a device copy of a host array.

    ``ordered``: the caller's current CuPy stream is PyTorch's current stream on the
    tensors' device (``streams.on_torch_stream``), so PyTorch's pending writes to them are
    already ordered before anything launched now: a PyTorch CUDA tensor is then viewed
    from its pointer, shape and strides (``_torch_view``, ~5 us a tensor), without DLPack's
    stream handshake (~16 us a tensor, docs/performance.md v43). Otherwise through DLPack,
    which makes the current stream wait for PyTorch's."""
    cp = cupy()
    if cp is None:
        raise RuntimeError("the CUDA backend needs CuPy and a CUDA GPU; neither was found")
    if is_cupy(x):  # gpu-only: everything below runs with CuPy and a GPU
        out = x
    elif ordered and _is_torch_type(type(x)) and (view := _torch_view(cp, x)) is not None:  # gpu-only
        out = view
    elif framework_of(x) == "torch" or (hasattr(x, "__dlpack__") and is_device_array(x)):  # gpu-only
        if (err := _unsigned_view_refused(x)) is not None:  # (callers name the argument: ``refused``)
            raise err
        out = cp.from_dlpack(x)
    elif hasattr(x, "__cuda_array_interface__"):  # gpu-only
        if (err := _unsigned_view_refused(x)) is not None:
            raise err
        out = cp.asarray(x)
    else:  # gpu-only
        out = cp.asarray(np.asarray(x))
    if dtype is not None and out.dtype != dtype:  # gpu-only
        out = out.astype(dtype)
    return out  # gpu-only


@functools.cache
def _torch_dtypes(torch):  # gpu-only
    """PyTorch dtypes -> NumPy dtypes, for those both have (no bfloat16, no float8)."""
    names = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "float32",
             "float64", "complex64", "complex128"]
    return {getattr(torch, n): np.dtype(n) for n in names if hasattr(torch, n)}


def _plain_cuda_tensor(torch, t) -> bool:  # gpu-only
    """Whether ``t`` is a PyTorch tensor whose memory a kernel may read from its pointer,
    shape and strides alone (``torch``: the module, or None where it is not imported): on a
    CUDA device, strided, not empty, not requiring grad and with no lazy negation or
    conjugation bit. ``to_cupy``'s other paths decide for every other tensor (a negation or
    conjugation bit refused there, a gradient by DLPack)."""
    return (torch is not None and isinstance(t, torch.Tensor) and t.is_cuda and t.layout == torch.strided
            and not t.requires_grad and not t.is_neg() and not t.is_conj() and t.numel() != 0)


def _torch_view(cp, t):  # gpu-only
    """A CuPy array over CUDA tensor ``t``'s memory (its shape, strides and dtype; it keeps
    ``t`` alive), or None where ``to_cupy``'s other paths must decide: a tensor on the host,
    empty, of a dtype NumPy lacks, not strided, requiring grad (DLPack refuses it), or with a
    lazy negation or conjugation bit (``to_cupy`` refuses it: DLPack would export the memory
    without the sign)."""
    torch = sys.modules.get("torch")
    dtype = _torch_dtypes(torch).get(t.dtype) if _plain_cuda_tensor(torch, t) else None
    if dtype is None:
        return None
    count = t.numel()
    shape = tuple(t.shape)
    if t.is_contiguous():  # the common case: no strides to convert (a call views ~8 tensors)
        span, strides = count * dtype.itemsize, None
    else:
        steps = t.stride()
        # torch strides are never negative: the memory spans to the last element
        span = (sum((n - 1) * st for n, st in zip(shape, steps)) + 1) * dtype.itemsize
        strides = tuple(st * dtype.itemsize for st in steps)
    memory = cp.cuda.UnownedMemory(t.data_ptr(), span, t, t.get_device())  # the device given: no pointer query
    # the scalar type, not the dtype object: CuPy 14's constructor takes ~1.0 us from a type
    # and ~1.7 from a dtype (exp/torch_view_parts.py, v89)
    return cp.ndarray(shape, dtype.type, cp.cuda.MemoryPointer(memory, 0), strides=strides)


class Operand(NamedTuple):
    """A device array as a kernel launched by address reads it: ``arg``, what the launch
    passes (the CuPy array itself, or a view of it that holds its memory, or a PyTorch
    tensor's address as a NumPy uint64: the caller's tensor holds the memory for the call),
    its address, shape, dtype name (``dtype_name``'s: 'bfloat16' for a bfloat16 tensor,
    whose bits the kernels read), element size in bytes, device and C-contiguity."""

    arg: object
    ptr: int
    shape: tuple
    dtype: str
    itemsize: int
    device: int
    contiguous: bool


def device_operand(x, *, ordered=False, arg="q"):  # gpu-only
    """``Operand`` of a device array ``x``, for a call that needs no CuPy array of it: a CuPy
    array's own; a PyTorch CUDA tensor's read from the tensor where ``ordered`` (as
    ``to_cupy``; ~1 us against ~3-5 for a CuPy view of it); otherwise that of
    ``query_to_cupy(x, ordered=ordered, arg=arg)``'s view (DLPack, or a bfloat16 or float8
    tensor's bits), with its errors."""
    if not is_cupy(x):
        if ordered and _is_torch_type(type(x)) and (op := _torch_operand(x)) is not None:
            return op
        x, bits_of = query_to_cupy(x, ordered=ordered, arg=arg)
        if bits_of is not None:
            return _new_operand(Operand, (x, x.data.ptr, x.shape, bits_of, x.itemsize, x.data.device_id,
                                          c_contiguous(x)))
    memory = x.data
    return _new_operand(Operand, (x, memory.ptr, x.shape, dtype_name(x), x.itemsize, memory.device_id,
                                  c_contiguous(x)))


# the tuple's own constructor: ~0.2 us against ~0.45 for the named tuple's, which takes keywords
_new_operand = tuple.__new__


def _torch_operand(t):  # gpu-only
    """``Operand`` of CUDA tensor ``t`` read from its attributes, or None where ``_torch_view``
    would leave it to DLPack (a tensor on the host, empty, not strided, requiring grad, or
    with a lazy negation or conjugation bit), or of a dtype whose size is not known here."""
    if not _plain_cuda_tensor(sys.modules.get("torch"), t):
        return None
    name = dtype_name(t)
    itemsize = _OPERAND_SIZES.get(name)
    if itemsize is None:
        return None
    ptr = t.data_ptr()
    return _new_operand(Operand, (np.uint64(ptr), ptr, tuple(t.shape), name, itemsize, t.get_device(),
                                  t.is_contiguous()))


_OPERAND_SIZES = {"bool": 1, "uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
                  "uint64": 8, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float32": 4, "float64": 8}


def as_array(xp, x, name, *, copy=False):
    """``xp.asarray(x)`` (``xp.array`` with ``copy``), NumPy or CuPy; TypeError naming ``name``
    where the module cannot make one array of ``x`` (a ragged nested list, a dict)."""
    if (err := _unsigned_view_refused(x)) is not None:  # (CuPy reads a tensor through its interface, unsigned)
        raise TypeError(f"{name}: {torch_refusal(x, grad=False) or err}")
    try:
        return xp.array(x) if copy else xp.asarray(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected an array, got a {type(x).__name__} that is not one "
                        "(a ragged nested list?)") from None


def byte_extent(x):
    """(first byte, one past the last byte) of the memory array ``x`` reaches, as an address
    (host and device addresses share one space under CUDA's unified addressing), for
    NumPy and CuPy arrays, PyTorch tensors and arrays with ``__cuda_array_interface__``;
    None for anything else, or an empty array."""
    kind = framework_of(x)
    if kind == "cupy":  # gpu-only: the hot path (a call's views), ~0.3 us
        if x.size == 0:
            return None
        if c_contiguous(x):
            start = x.data.ptr
            return start, start + x.nbytes
        return _extent(x.data.ptr, x.shape, x.strides, x.itemsize)
    if kind == "numpy" and isinstance(x, np.ndarray):
        return _extent(x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize)
    if kind == "torch":  # gpu-only (PyTorch is not a dependency)
        size = x.element_size()
        return _extent(x.data_ptr(), tuple(x.shape), tuple(st * size for st in x.stride()), size)
    if hasattr(x, "__cuda_array_interface__"):  # gpu-only (JAX arrays, Numba's)
        face = x.__cuda_array_interface__
        size = np.dtype(face["typestr"]).itemsize
        shape = tuple(face["shape"])
        steps = face.get("strides") or tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * size
                                             for i in range(len(shape)))
        return _extent(face["data"][0], shape, steps, size)
    return None


def _extent(start, shape, steps, itemsize):
    """``byte_extent`` of the array at ``start`` of ``shape``, byte ``steps`` and ``itemsize``."""
    if any(n == 0 for n in shape):
        return None
    low = start + sum((n - 1) * st for n, st in zip(shape, steps) if st < 0)
    high = start + sum((n - 1) * st for n, st in zip(shape, steps) if st > 0) + itemsize
    return low, high


def query_to_numpy(x):
    """``to_numpy(x)`` for a query: a bfloat16 or float8_e4m3fn PyTorch tensor, which NumPy
    cannot hold without ml_dtypes, as float32 (every value of either is one exactly: the
    scores are the same)."""
    if framework_of(x) == "torch" and dtype_name(x) in BITS_DTYPES:  # gpu-only (PyTorch is not a dependency)
        if not x.is_contiguous():  # as a float32 one is: the widening below would copy it into order
            raise ValueError("q: expected a C-contiguous array")
        return x.detach().cpu().resolve_neg().float().numpy()
    return to_numpy(x)


def to_numpy(x):
    """A NumPy array of ``x`` (a host copy for device arrays)."""
    if is_cupy(x):  # gpu-only
        return x.get()
    if framework_of(x) == "torch":  # gpu-only (PyTorch is not a dependency)
        # a lazy negation or conjugation bit resolved into the copy (NumPy has none)
        return x.detach().cpu().resolve_neg().resolve_conj().numpy()
    return np.asarray(x)


def wrap_like(result, like):  # gpu-only
    """Return ``result`` (a CuPy array) in the framework of ``like``."""
    kind = framework_of(like)
    if kind == "cupy":
        return result
    if kind == "torch":
        import torch  # noqa: PLC0415  (only reached when the caller passed a tensor)

        return torch.from_dlpack(result)
    if kind == "numpy":
        return result.get()
    if kind == "jax":  # a JAX array over the same device memory (zero copy through DLPack)
        import jax.dlpack  # noqa: PLC0415  (only reached when the caller passed a JAX array)

        try:
            return jax.dlpack.from_dlpack(result)  # JAX versions that take __dlpack__ objects
        except TypeError:
            return jax.dlpack.from_dlpack(result.toDlpack())  # older ones: a capsule
    return result
