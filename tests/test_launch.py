"""indexer.launch's argument layout, without a GPU: each kernel argument becomes the C
value CuPy would pass (NumPy scalars by their dtype, Python ints as 64-bit integers), each
in an 8-byte slot of one buffer, after the pointer array that addresses the slots."""

import ctypes
import struct

import numpy as np
import pytest

from indexer import launch


@pytest.mark.parametrize("value,fmt,expected", [
    (np.int32(-7), "<i", -7),
    (np.int64(1 << 40), "<q", 1 << 40),
    (np.uint32(3_000_000_000), "<I", 3_000_000_000),
    (np.float32(0.1), "<f", float(np.float32(0.1))),
    (np.float64(-2.5), "<d", -2.5),
    (0, "<q", 0),  # a null pointer argument, as the launches pass it
    (None, "<Q", 0),
])
def test_arguments_take_the_c_type_cupy_would_pass(value, fmt, expected):
    buf, address = launch._pack_arguments([np.int32(11), value, np.int64(-1)])
    assert address == ctypes.addressof(buf)
    params = struct.unpack("<3Q", ctypes.string_at(address, 24))  # the pointer array: slots after it
    assert params == (address + 24, address + 32, address + 40)
    raw = ctypes.string_at(params[1], struct.calcsize(fmt))
    assert struct.unpack(fmt, raw)[0] == expected
    assert struct.unpack("<i", ctypes.string_at(params[0], 4))[0] == 11
    assert struct.unpack("<q", ctypes.string_at(params[2], 8))[0] == -1


@pytest.mark.parametrize("bad", [True, "3", [1], np.int8(1), np.complex64(1)])
def test_other_arguments_are_refused_by_name(bad):
    with pytest.raises(TypeError, match="kernel argument"):
        launch._pack_arguments([bad])


def test_the_config_struct_has_the_drivers_layout():
    # cuda.h: CUlaunchConfig is 6 + 1 uints, a stream, an attribute pointer and a uint;
    # CUlaunchAttribute is an id padded to 8 bytes and a 64-byte value
    assert ctypes.sizeof(launch._Attr) == 72
    assert launch._Config.stream.offset == 32 and launch._Config.attrs.offset == 40
    assert ctypes.sizeof(launch._Config) == 56
    assert launch._PROGRAMMATIC.contents.id == 6 and launch._PROGRAMMATIC.contents.value.programmatic == 1


class _Stream:
    def __init__(self, answer):
        self.answer = answer

    def is_capturing(self):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer,expected", [(True, (True, None)), (False, (False, None)), (1, (True, None))])
def test_capture_state_reports_the_streams_answer(answer, expected):
    from indexer import streams

    assert streams.capture_state(_Stream(answer)) == expected


def test_a_failed_capture_query_is_reported_not_raised():
    from indexer import streams

    err = RuntimeError("capture invalidated")
    assert streams.capture_state(_Stream(err)) == (None, err)


class _Recorder:
    """A context that logs its enters and exits (and can fail to enter)."""

    def __init__(self, log, name, fail=False):
        self.log, self.name, self.fail = log, name, fail

    def __enter__(self):
        if self.fail:
            raise RuntimeError(f"{self.name} refused")
        self.log.append(f"enter {self.name}")
        return self

    def __exit__(self, *exc):
        self.log.append(f"exit {self.name}")
        return False


def _fake_cupy_of_devices(log):
    import types

    cuda = types.SimpleNamespace(Device=lambda i: _Recorder(log, f"device {i}"),
                                 runtime=types.SimpleNamespace(getDevice=lambda: 3))
    return types.SimpleNamespace(cuda=cuda)


@pytest.mark.parametrize("stream_fails", [False, True])
def test_using_enters_the_device_then_the_stream_and_leaves_both_whatever_happens(monkeypatch, stream_fails):
    from indexer import arrays, streams

    log = []
    monkeypatch.setattr(arrays, "cupy", lambda: _fake_cupy_of_devices(log))
    chosen = _Recorder(log, "stream", fail=stream_fails)
    monkeypatch.setattr(streams, "resolve", lambda stream, inputs, device_id: chosen)
    host = [np.arange(3, dtype=np.float32) + 1]  # no device array: the current device (3)
    if stream_fails:  # the device entered is left again; the stream's error stands
        with pytest.raises(RuntimeError, match="^stream refused$"):
            with streams.using(None, host):
                log.append("body")
        assert log == ["enter device 3", "exit device 3"]
        return
    with pytest.raises(ValueError, match="^in the body$"):
        with streams.using(None, host) as got:
            assert got is chosen
            log.append("body")
            raise ValueError("in the body")
    assert log == ["enter device 3", "enter stream", "body", "exit stream", "exit device 3"]
    log.clear()
    monkeypatch.setattr(streams, "resolve", lambda stream, inputs, device_id: None)  # no stream chosen
    with streams.using(None, host) as got:
        assert got is None
    assert log == ["enter device 3", "exit device 3"]
