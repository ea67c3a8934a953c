"""Which CUDA stream (and GPU) a GPU call runs on.

The kernels run on CuPy's current stream. That is right for CuPy callers; a PyTorch caller
expects the work on ``torch.cuda.current_stream(device)`` (the stream its own kernels, its
caching allocator and ``torch.cuda.graph`` capture use), so with PyTorch tensors among the
inputs the call runs there, wrapped as a ``cupy.cuda.ExternalStream``. A ``stream=``
argument overrides both: a CuPy stream, a raw ``cudaStream_t`` pointer (int), a
``torch.cuda.Stream`` or any object with ``__cuda_stream__`` (the CUDA stream protocol).

PyTorch is never imported here: when a tensor is among the inputs, ``torch`` is already in
``sys.modules``.
"""

from __future__ import annotations

import functools
import sys
import warnings

from . import arrays

__all__ = ["capture_state", "check_stream", "device_of", "on_torch_stream", "resolve", "torch_stream_ptr", "using"]


def capture_state(stream):  # gpu-only
    """(whether CuPy stream ``stream`` is capturing a CUDA graph, None; or None, the error
    when the query itself failed: an invalidated capture, or a query illegal during one)."""
    try:
        return bool(stream.is_capturing()), None
    except Exception as exc:  # noqa: BLE001
        return None, exc


def _module(x) -> str:
    return type(x).__module__.split(".")[0]


def check_stream(stream):
    """The kind of a ``stream=`` argument: None, 'cupy', 'int', 'torch' or 'protocol'.

    Needs no GPU (the CPU backend checks and then ignores the argument). TypeError or
    ValueError naming ``stream`` for anything else.
    """
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise TypeError("stream: expected a CuPy stream, a stream pointer (int) or a torch.cuda.Stream, got bool")
    if isinstance(stream, int):
        if not 0 <= stream < 2**64:
            raise ValueError(f"stream: expected a cudaStream_t pointer (0 to 2**64 - 1), got {stream}")
        return "int"
    if _module(stream) == "cupy" and hasattr(stream, "ptr"):
        return "cupy"
    if _module(stream) == "torch" and hasattr(stream, "cuda_stream"):
        return "torch"
    if hasattr(stream, "__cuda_stream__"):
        return "protocol"
    raise TypeError("stream: expected a CuPy stream, a stream pointer (int), a torch.cuda.Stream or an object "
                    f"with __cuda_stream__, got {type(stream).__name__}")


def device_of(inputs) -> int:  # gpu-only
    """The CUDA device of the first device array among ``inputs`` (the current CuPy device
    when all are host arrays)."""
    cp = arrays.cupy()
    for x in inputs:
        if arrays.is_cupy(x):
            return int(x.data.device_id)  # (x.device builds a Device object)
        if arrays.framework_of(x) == "torch" and getattr(x, "is_cuda", False):
            return int(x.device.index)
        if hasattr(x, "__dlpack_device__") and arrays.is_device_array(x):
            return int(x.__dlpack_device__()[1])
    return int(cp.cuda.runtime.getDevice())


@functools.lru_cache(maxsize=256)
def _external(ptr: int, device_id: int):  # gpu-only
    # one wrapper per (stream, device): cheap to reuse on every call, and CuPy 14's
    # deprecation warning for ExternalStream is silenced once instead of per call
    cp = arrays.cupy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(int(ptr), int(device_id))


def _check_device(where, device_id):  # gpu-only
    if where is not None and where >= 0 and where != device_id:
        raise ValueError(f"stream: a stream of cuda:{where}, but the inputs are on cuda:{device_id}")


def torch_stream_ptr(torch, device_id: int) -> int:  # gpu-only
    """The ``cudaStream_t`` of ``torch.cuda.current_stream(device_id)``: through PyTorch's
    raw-stream query where it has one (~0.1 us, the one its compiled kernels' launchers
    use), else through the public ``Stream`` object (~1.6 us: it builds a Python object)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device_id))
    return int(torch.cuda.current_stream(device_id).cuda_stream)


def _has_torch(inputs):
    """PyTorch's module when a PyTorch tensor is among ``inputs``, else None."""
    torch = sys.modules.get("torch")
    if torch is None or not arrays.any_torch(inputs):
        return None
    return torch


def resolve(stream, inputs, device_id: int):  # gpu-only
    """The CuPy stream a GPU call on ``device_id`` runs on, or None for CuPy's current one.

    ``stream`` as ``check_stream`` takes it; when None, PyTorch tensors among ``inputs``
    select ``torch.cuda.current_stream(device_id)``.
    """
    kind = check_stream(stream)
    if kind is None:
        torch = _has_torch(inputs)
        return None if torch is None else _external(torch_stream_ptr(torch, device_id), device_id)
    if kind == "cupy":
        _check_device(getattr(stream, "device_id", -1), device_id)
        return stream
    if kind == "int":
        return _external(stream, device_id)
    if kind == "torch":
        _check_device(stream.device.index, device_id)
        return _external(stream.cuda_stream, device_id)
    return _external(stream.__cuda_stream__()[1], device_id)


def on_torch_stream(inputs) -> bool:  # gpu-only
    """Whether PyTorch tensors are among ``inputs`` and CuPy's current stream is PyTorch's
    current stream on CuPy's current device (inside ``using``: the call's stream is the one
    PyTorch's own work on the tensors is ordered on), so the tensors need no stream
    handshake to be read or written now (``arrays.to_cupy(..., ordered=True)``)."""
    torch = _has_torch(inputs)
    if torch is None:
        return False
    cp = arrays.cupy()
    return cp.cuda.get_current_stream().ptr == torch_stream_ptr(torch, int(cp.cuda.runtime.getDevice()))


class using:  # gpu-only
    """Make the inputs' GPU current and, when one is chosen, the call's stream (see
    ``resolve``): ``with using(stream, inputs) as chosen:`` gives that CuPy stream or None.
    Everything inside (conversions through DLPack, validation, launches) is then ordered on
    one stream. (A class, not a generator's context: with the device number read without a
    Device object, 5.8 -> 2.6-3.0 us of host time a call, docs/performance.md v88.)"""

    __slots__ = ("_device", "_chosen")

    def __init__(self, stream, inputs):
        cp = arrays.cupy()
        device_id = device_of(inputs)
        self._chosen = resolve(stream, inputs, device_id)
        self._device = cp.cuda.Device(device_id)

    def __enter__(self):
        self._device.__enter__()
        if self._chosen is not None:
            try:
                self._chosen.__enter__()
            except BaseException:
                self._device.__exit__(None, None, None)
                raise
        return self._chosen

    def __exit__(self, kind, value, tb):
        try:
            if self._chosen is not None:
                self._chosen.__exit__(kind, value, tb)
        finally:
            self._device.__exit__(kind, value, tb)
        return False
