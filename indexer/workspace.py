"""A preallocated device workspace: GPU calls that take no memory from CuPy's pool.

Why: a GPU ``score_topk`` needs scratch memory (the staged fp16 queries, a float32 score
row per query in flight, histograms, selection candidates). By default each call takes it
from CuPy's memory pool and gives it back when the call returns. A CUDA graph captured
around such a call records the addresses of that memory; once the call has returned, CuPy
may hand the same memory to any other array, and every replay of the graph then writes its
scratch data over that array. A ``Workspace`` owns its buffer for as long as it lives, so
the addresses a graph captures stay valid and private to the graph:

    ws = indexer.Workspace()
    idx = torch.empty(T, top_k, dtype=torch.int32, device="cuda")
    indexer.score_topk(..., validate=False, workspace=ws, out=idx)      # warm-up: sizes ws
    with torch.cuda.graph(g):
        indexer.score_topk(..., validate=False, workspace=ws, out=idx)  # allocates nothing

Rules:

* The workspace holds one buffer per device (plus small ones per device: the per-token
  block table of ``score_topk_ragged``, and the select's histograms kept zero at rest). A
  call that needs more bytes than the buffer holds reallocates it (grows); it never
  shrinks. Growing replaces the buffer; a buffer that a call captured into a CUDA graph
  used is kept (not freed) once outgrown, for as long as the workspace lives, so the graph
  stays valid after a larger call (as PyTorch's per-shape graphs of
  ``torch.compile(mode="reduce-overhead")`` need); ``nbytes`` counts it. To hold only one
  set, size the workspace first (one call with the largest shapes), then capture.
  (``indexer.PreparedCall``'s own graphs are captured again after a growth instead.)
* Growing is refused while the current stream is capturing (RuntimeError): make one call
  with the same shapes (``reserve`` sizes the main scratch part only) before the capture.
* Calls that share a workspace are ordered by it: a call on another stream than the
  workspace's previous call on that device waits (on the GPU, through an event the previous
  call recorded as it ended) for that call to finish, and calls from several threads take
  their turns (one lock a workspace). So one workspace serves any streams and threads,
  with their calls run one after another. What it cannot order is a CUDA graph replayed
  outside this package (``torch.cuda.graph``, ``torch.compile``'s graphs): such a replay on
  one stream beside calls on another, sharing the workspace, is the caller's to order, as
  the calls inside a capture are (a capture neither waits nor records).
* Keep the workspace alive as long as any graph that uses it.
* The NumPy backend accepts a workspace and ignores it (it has no device memory).

The workspace also keeps, per device, the counters from which the balanced scoring
kernels' CTAs claim their shares of the tiles (four pairs: a call's runs of rows alternate
between two, and a split pair call's lone-row launches between the other two); each kernel
sets its pair back to zero as it ends, so they too are zero between calls.

Beside its scratch buffer the workspace keeps the select's per-row histograms (of score
bits), or for the dense kernel's calls a count a row of the scores stored (which lets the
row select start on each row as soon as the CTAs holding it have ended), in a part of their
own that is zero between calls: each call's last kernel clears what its first ones counted,
so a call on a workspace launches no fill of them (a memset node less in a captured graph). A call that stops between its launches (an
exception, Ctrl-C) clears what it counted on its stream before it raises, so graphs captured
earlier on the workspace stay right; it also leaves the part marked dirty, and the next call
fills it first. The benchmark's scoring-only calls count into scratch memory instead.
"""

from __future__ import annotations

import contextlib
import numbers
import threading

from . import arrays, streams

__all__ = ["Workspace", "check_budget", "check_workspace", "turn_of"]

# buffers grow in whole MiB: calls whose shapes differ a little do not each reallocate
_GRANULE = 1 << 20
# the zeroed part (an 8 KB histogram a row) in 64 KiB steps: a batch-1 call's 8 KB would
# otherwise hold a whole MiB
_ZEROED_GRANULE = 1 << 16
# the claim counters' part (four pairs of uint32 used)
_CLAIMS_BYTES = 256
# sets of views kept by Workspace.views (one a call shape and at-rest state): dropped all at
# once past this many
_MAX_VIEWS = 256


class Workspace:
    """Device scratch memory that ``score_topk(..., workspace=ws)`` carves its buffers from
    instead of CuPy's memory pool (see the module docstring for why and the rules).

    Attributes
    ----------
    nbytes : int   bytes held, over all devices (0 until the first GPU call or ``reserve``)
    generation : int   how many times a buffer was replaced (grown); a graph captured over
                   the old buffers stays valid (they are kept), but is not the current
                   buffers' (``PreparedCall`` captures its graphs again when it moves)
    """

    def __init__(self):
        self._buffers = {}  # (device id, part) -> CuPy uint8 array, 1-D
        self._born = {}  # (device id, part) -> the generation its buffer was allocated at
        self._captured_at = {}  # device id -> the generation at its latest call under a capture
        self._retired = []  # outgrown buffers a captured graph used: kept while the workspace lives
        self._untracked = False  # while PreparedCall captures (its graphs are dropped on growth)
        self._lock = threading.Lock()  # growth from several threads replaces a buffer once
        # one call at a time: held from a call's start to its end (its launches, and the host
        # read-backs of validate=True and host results), over all devices
        self._turn = threading.RLock()
        self._depth = 0  # calls inside calls (a grouped call's per-token table, then its scoring)
        # device id -> (event the last call recorded at its end, its stream's key, the stream
        # object: kept alive, so a stream CuPy owns is not destroyed while its call may still
        # run and its handle handed to a new stream, which would then pass for the same one)
        self._ended = {}
        self._zero_at_rest = {}  # device id -> whether its "zeroed" part is all zero now
        self._views = {}  # (device id, key) -> what `views` made of the launch buffer
        self._claim_views = {}  # (device id, "claims") -> (its buffer, the four pairs' views)
        # buffers replaced so far: graphs captured over the old ones (indexer.PreparedCall's)
        # are stale once it moves
        self.generation = 0

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in [*self._buffers.values(), *self._retired])

    def turn(self):  # gpu-only
        """The context of one call on CuPy's current device and stream (``with ws.turn():``):
        it waits for the calls of other threads on this workspace, and on the GPU for the
        workspace's previous call where that ran on another stream; as it ends it records
        where this call ends. Under a capture it does neither on the GPU, and marks the
        device's buffers of now as kept once outgrown (see the module docstring). ~4.2-4.6 us
        of host time a call (docs/performance.md v88). RuntimeError without CuPy and a GPU."""
        if arrays.cupy() is None:  # (cached: nothing on the hot path)
            raise RuntimeError("Workspace.turn: needs CuPy and a CUDA GPU (pip install cupy-cuda13x for CUDA 13 or cupy-cuda12x for CUDA 12)")
        return _Turn(self)

    @contextlib.contextmanager
    def untracked_capture(self):
        """Calls captured inside keep no buffer from being freed when outgrown: for a caller
        that drops its graphs when ``generation`` moves (``PreparedCall``)."""
        self._untracked = True
        try:
            yield
        finally:
            self._untracked = False

    def reserve(self, nbytes, device=None) -> None:
        """Grow the buffer of ``device`` (a CUDA device number; None: CuPy's current
        device) to at least ``nbytes`` bytes now, e.g. before a graph capture whose calls
        must not allocate. Never shrinks."""
        if not isinstance(nbytes, numbers.Integral) or isinstance(nbytes, bool):
            raise TypeError(f"nbytes: expected an int, got {type(nbytes).__name__}")
        if nbytes < 0:
            raise ValueError(f"nbytes: expected an int >= 0, got {nbytes}")
        if device is not None and (not isinstance(device, numbers.Integral) or isinstance(device, bool)):
            raise TypeError(f"device: expected a CUDA device number or None, got {type(device).__name__}")
        if device is not None and device < 0:
            raise ValueError(f"device: expected a CUDA device number >= 0, got {device}")
        cp = arrays.cupy()
        if cp is None:
            raise RuntimeError("Workspace.reserve: needs CuPy and a CUDA GPU (pip install cupy-cuda13x for CUDA 13 or cupy-cuda12x for CUDA 12)")
        count = cp.cuda.runtime.getDeviceCount()  # gpu-only
        if device is not None and device >= count:  # gpu-only
            raise ValueError(f"device: {device}, but CuPy sees {count} CUDA device(s)")
        with cp.cuda.Device(device if device is not None else cp.cuda.runtime.getDevice()), self.turn():  # gpu-only
            self.buffer(int(nbytes))
            self.claim_counters()  # zero-filled on this stream: later calls on others wait for it

    def buffer(self, nbytes: int, part: str = "launch", granule: int = _GRANULE):  # gpu-only
        """A uint8 CuPy array of ``nbytes`` bytes: the start of this workspace's ``part``
        buffer on the current CuPy device, grown first if it is smaller. Used by the CUDA
        backend; the contents are scratch (overwritten by every call)."""
        cp = arrays.cupy()
        key = (int(cp.cuda.runtime.getDevice()), part)
        buf = self._buffers.get(key)
        if buf is None or buf.nbytes < nbytes:
            with self._lock:
                buf = self._buffers.get(key)
                if buf is None or buf.nbytes < nbytes:
                    _refuse_during_capture(cp, nbytes, 0 if buf is None else int(buf.nbytes), part)
                    size = max(granule, -(-nbytes // granule) * granule)
                    # drop the old buffer before allocating: the pool can reuse its memory
                    # (and every view made of it: `views` makes them again); kept instead
                    # where a graph captured since it was allocated may use it
                    buf = self._buffers.pop(key, None)
                    if buf is not None and self._born.get(key, 0) <= self._captured_at.get(key[0], -1):
                        self._retired.append(buf)
                    elif buf is not None:
                        # CuPy's pool may hand the memory out at once on the stream that
                        # allocated it, while an earlier call on another stream still reads
                        # it: wait for them all (this stream waited for the last one's end)
                        cp.cuda.get_current_stream().synchronize()
                    del buf
                    # the device's kept views may cut any of its parts: made again
                    self._views = {k: v for k, v in self._views.items() if k[0] != key[0]}
                    self.generation += 1
                    self._buffers[key] = buf = cp.empty(size, dtype=cp.uint8)
                    self._born[key] = self.generation
        return buf[:nbytes]

    def views(self, key, make):  # gpu-only
        """``make()``'s result (views the caller cuts from ``buffer`` and ``zeroed``), made
        once per ``key`` and device and kept until one of this device's parts is replaced: a call of a
        shape already seen takes its workspace views from here (each view costs ~2 us of
        host time to cut). ``make`` may grow the buffer; what it returns is kept after."""
        cp = arrays.cupy()
        k = (int(cp.cuda.runtime.getDevice()), key)
        made = self._views.get(k)
        if made is None:
            made = make()
            with self._lock:
                if len(self._views) >= _MAX_VIEWS:
                    self._views = {}
                self._views[k] = made
        return made

    def zeroed(self, nbytes: int):  # gpu-only
        """(a uint8 CuPy array of ``nbytes`` bytes, whether it is all zero now): the start
        of this workspace's "zeroed" part on the current device, for the select's histograms,
        which every complete call leaves zero (see the module docstring). Grown if smaller
        (a new buffer, zero-filled); the caller marks it dirty with ``mark_zeroed(False)``
        before its first launch and clean again after its last. None where it would have to
        grow while the stream is capturing (a capture right after ``reserve``, before any
        call): the caller then keeps its histograms in scratch, filled each call."""
        clean = self.zeroed_state(nbytes)
        if clean is None:
            return None
        cp = arrays.cupy()
        return self._buffers[(int(cp.cuda.runtime.getDevice()), "zeroed")][:nbytes], clean

    def zeroed_state(self, nbytes: int):  # gpu-only
        """``zeroed(nbytes)[1]`` (or None where ``zeroed`` gives None) without cutting the
        view (~2 us of host time; a call takes its view from ``views``): the part is grown
        first as ``zeroed`` grows it."""
        cp = arrays.cupy()
        dev = int(cp.cuda.runtime.getDevice())
        key = (dev, "zeroed")
        held = self._buffers.get(key)
        if held is None or held.nbytes < nbytes:
            if streams.capture_state(cp.cuda.get_current_stream())[0] is not False:
                return None
            self.buffer(nbytes, part="zeroed", granule=_ZEROED_GRANULE)  # growth rules as for scratch
            with self._lock:
                self._buffers[key].fill(0)
                self._zero_at_rest[dev] = True
        return self._zero_at_rest.get(dev, False)

    def claim_counters(self):  # gpu-only
        """Four uint32 [2] views on the current device, zero at rest: the counters from which
        the balanced scoring kernels' CTAs claim their shares of tiles (kernels/wgmma_common.cuh:
        ShareClaims), a pair for the even runs of rows of a call and one for the odd ones (a
        scoring kernel lets the next kernel be placed before its last CTAs clear their pair,
        and where the next is the next run's scoring kernel, a scoring-only call's, it claims
        from the other pair), then the same two for a split pair call's lone-row launches
        (``geometry.pairs_split``); every launch that uses a pair leaves it zero. Allocated
        zero-filled on first use (or by ``reserve``); None while the stream is capturing before
        then (the call then gives its CTAs equal shares)."""
        cp = arrays.cupy()
        key = (int(cp.cuda.runtime.getDevice()), "claims")
        buf = self._buffers.get(key)
        if buf is None:
            if streams.capture_state(cp.cuda.get_current_stream())[0] is not False:
                return None
            with self._lock:
                buf = self._buffers.get(key)
                if buf is None:
                    self._buffers[key] = buf = cp.zeros(_CLAIMS_BYTES // 4, dtype=cp.uint32)
        # the views made once (every call of a balanced kernel asks: a slice costs ~2 us of
        # host time)
        made = self._claim_views.get(key)
        if made is None or made[0] is not buf:
            made = self._claim_views[key] = (buf, (buf[:2], buf[2:4], buf[4:6], buf[6:8]))
        return made[1]

    def at_rest(self, device_id: int) -> bool:
        """Whether the "zeroed" part of device ``device_id`` is marked all zero (as
        ``zeroed_state`` reads it, without growing anything)."""
        return self._zero_at_rest.get(device_id, False)

    def mark_zeroed(self, clean: bool) -> None:  # gpu-only
        """Record whether the current device's "zeroed" part is all zero once the work
        enqueued so far has run."""
        cp = arrays.cupy()
        self._zero_at_rest[int(cp.cuda.runtime.getDevice())] = bool(clean)

    def __repr__(self):
        where = sorted({d for d, _ in self._buffers})
        return f"Workspace(nbytes={self.nbytes}, devices={where})"


class _Turn:  # gpu-only
    """``Workspace.turn``'s context (a class: ~1 us of host time less than a generator's). A
    turn inside a turn of the same thread (a grouped call's scoring inside its call) is the
    outer one's: the library nests them on one stream only."""

    __slots__ = ("ws", "stream", "key", "device", "event", "counted")

    def __init__(self, ws):
        self.ws, self.stream, self.counted = ws, None, False

    @property
    def capturing(self):
        """False where this turn found its stream not capturing (a replay then need not ask
        again; it waits and records only then), else None: unknown."""
        return False if self.stream is not None else None

    def __enter__(self):
        ws = self.ws
        self.stream = None  # (a turn entered again answers afresh)
        ws._turn.acquire()
        try:
            ws._depth += 1
            self.counted = True
            if ws._depth > 1:  # inside a call that already took its turn
                return self
            cp = arrays.cupy()
            stream = cp.cuda.get_current_stream()
            if streams.capture_state(stream)[0] is not False:
                # a capture: the graph's replays are ordered by whoever launches them, and
                # the buffers it uses are kept once outgrown (but for untracked_capture's)
                if not ws._untracked:
                    ws._captured_at[int(cp.cuda.runtime.getDevice())] = ws.generation
                return self
            self.stream, self.key, self.device = stream, _stream_key(stream), int(cp.cuda.runtime.getDevice())
            ended = ws._ended.get(self.device)
            self.event = None
            if ended is not None:
                self.event = ended[0]
                if ended[1] != self.key:
                    cp.cuda.runtime.streamWaitEvent(stream.ptr, ended[0].ptr, 0)
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, kind, value, tb):
        try:
            if self.stream is not None:  # what was enqueued, even by a call that raised, ends here
                self._record()
        except Exception:
            # no record: forget the last one, which this call's work may follow (the stream
            # may be unusable); the call's own error, where it raised, is the one that stands
            self.ws._ended.pop(self.device, None)
            if kind is None:
                raise
        finally:
            self._leave()
        return False

    def _record(self):
        cp = arrays.cupy()
        event = self.event if self.event is not None else cp.cuda.Event(disable_timing=True)
        cp.cuda.runtime.eventRecord(event.ptr, self.stream.ptr)
        self.ws._ended[self.device] = (event, self.key, self.stream)

    def _leave(self):
        if self.counted:
            self.ws._depth -= 1
            self.counted = False
        self.ws._turn.release()


#: cudaStreamPerThread: one handle that names another stream in every thread
_PER_THREAD_STREAM = 2


def _stream_key(stream):  # gpu-only
    """What tells CuPy stream ``stream`` from the others: its handle, and for the per-thread
    default stream (the same handle in every thread) the thread too."""
    ptr = stream.ptr
    return (ptr, threading.get_ident()) if ptr == _PER_THREAD_STREAM else ptr


def _refuse_during_capture(cp, nbytes, held, part):  # gpu-only
    """RuntimeError when the current stream is capturing a CUDA graph: an allocation there
    would be pool memory the graph keeps using after the call (the hazard a workspace
    exists to avoid), or fail outright."""
    capturing, error = streams.capture_state(cp.cuda.get_current_stream())
    reason = f" (capture state: {error})" if error is not None else ""
    if capturing is not False:
        also = " (or ws.reserve(nbytes))" if part == "launch" else ""
        raise RuntimeError(
            f"workspace: this call needs {nbytes} bytes of its {part} part, the workspace holds {held} on this "
            f"device, and it cannot grow while the stream is capturing a CUDA graph{reason}; make one call with "
            f"the same shapes{also} before the capture")


def turn_of(workspace):  # gpu-only
    """``workspace.turn()``, or for no workspace a context that does nothing."""
    return _NO_TURN if workspace is None else workspace.turn()


_NO_TURN = contextlib.nullcontext()


def check_budget(workspace_budget):
    """``workspace_budget`` itself when it is None or a positive int (bytes); TypeError or
    ValueError naming it otherwise."""
    if workspace_budget is None:
        return None
    if not isinstance(workspace_budget, numbers.Integral) or isinstance(workspace_budget, bool):
        raise TypeError(f"workspace_budget: expected an int (bytes) or None, got {type(workspace_budget).__name__}")
    if workspace_budget <= 0:
        raise ValueError(f"workspace_budget: expected a positive number of bytes, got {workspace_budget}")
    return int(workspace_budget)


def check_workspace(workspace):
    """``workspace`` itself when it is None or a ``Workspace``; TypeError naming it otherwise."""
    if workspace is not None and not isinstance(workspace, Workspace):
        raise TypeError(f"workspace: expected an indexer.Workspace or None, got {type(workspace).__name__}")
    return workspace
