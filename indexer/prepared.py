"""``indexer.prepare``: a score + top-k call checked and planned once, then run many times.

A serving engine calls the indexer at every layer of every decode step with arrays of the
same shapes: the step's queries and weights, each layer's key pool, the step's block table
and lengths. ``score_topk`` checks and plans every call from scratch, which at batch 1
costs a few times the GPU's ~25 us in host time (docs/performance.md v46). ``prepare``
takes arrays of the shapes to come and the keyword arguments, does once every check that
depends only on them (types, dtypes, shapes, devices, keywords; the values too with
``validate=True``), compiles the kernels and fixes the launch plan. Each call of the
returned ``PreparedCall`` then checks only that its arrays have the prepared framework,
shape, dtype and device and are contiguous (and the keys aligned), and launches: the
plan / run split of FlashInfer's wrappers, for one op. Prepare once per step (or once for
good where the shapes never change), call once per layer::

    step = indexer.prepare(q[0], w[0], *pools[0], block_table, valid_lens, 512, physical=True)
    for layer in range(n_layers):
        step(q[layer], w[layer], *pools[layer], block_table, valid_lens, out=idx[layer])

Each call:

* runs on the GPU of the prepared arrays, on the stream ``score_topk`` would take
  (``stream=`` per call, else PyTorch's current stream for tensors, CuPy's otherwise);
* writes into ``out`` when given (checked every call), else returns new arrays;
* takes its scratch memory from one ``Workspace`` (``prepare``'s ``workspace=``, or one the
  prepared call owns), so it allocates nothing else beyond its results, and can be captured
  in a CUDA graph once a call has sized the workspace (the workspace's rules apply: calls
  on several streams or threads take turns on it, one after another);
* skips the value checks (block ids, lengths, global scales) as ``score_topk`` does with
  ``validate=False``: out-of-range values still cannot make a kernel read or write outside
  the arrays. That ``out`` shares no memory with the inputs is checked once for each set
  of pointers, before their graph is captured (not at all with ``graphs=False``).
  ``validate=True`` on a call runs the whole ``score_topk`` instead.

CuPy arrays and PyTorch CUDA tensors (or a mix: a ``KeyPool``'s CuPy arrays beside a
model's tensors) take the short path. The NumPy backend and other
arrays (NumPy arrays for the GPU, JAX, other DLPack arrays) take the whole public call
each time, after the same checks of the prepared shapes: the same results, without the
saving.
"""

from __future__ import annotations

import numpy as np

from . import arrays, ops, outbuf, ragged, streams, validate as _validate
from .workspace import Workspace

__all__ = ["prepare", "PreparedCall"]

_NAMES = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens", "cu_seqlens_q")
# CUDA graphs a prepared call keeps (one a set of pointers: e.g. a layer's arrays), and sets
# of pointers it counts the sightings of
_GRAPHS_MAX = 128
_SEEN_MAX = 4096


def prepare(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k, *, cu_seqlens_q=None,
            backend="auto", precision="fast", return_scores=False, physical=False, validate=True,
            workspace=None, workspace_budget=None, graphs=True):
    """A ``PreparedCall``: ``score_topk`` (or, with ``cu_seqlens_q``, ``score_topk_ragged``)
    for arrays of these shapes, dtypes, framework and device, checked and planned now.

    The arrays are examples of those every call will pass (same shapes, dtypes, framework
    and device; their contents are read only by ``validate=True``, which checks their
    values now, as ``score_topk`` would: one device synchronisation). Nothing is launched
    but the value checks (and, for grouped calls, the per-token block table they read).
    ``top_k``, ``backend``, ``precision``, ``return_scores``, ``physical`` and
    ``workspace_budget`` are fixed for every call. ``workspace``: the ``Workspace`` every
    call takes its scratch memory from (None: the prepared call makes its own). ``graphs``:
    replay the launches of calls given ``out=`` from a CUDA graph of their arrays' pointers,
    captured the second time the same pointers come (see ``PreparedCall``).
    """
    return PreparedCall(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k,
                        cu_seqlens_q=cu_seqlens_q, backend=backend, precision=precision,
                        return_scores=return_scores, physical=physical, validate=validate, workspace=workspace,
                        workspace_budget=workspace_budget, graphs=graphs)


def _numpy_alike(x, typ) -> bool:
    """Whether ``x``, not exactly of the prepared type ``typ``, is still taken for it: where
    ``typ`` is NumPy's ndarray, any subclass (an np.memmap is one)."""
    return typ is np.ndarray and isinstance(x, np.ndarray)


def _bits_view(x, ordered=False):  # gpu-only
    """The CuPy view of a bfloat16 or float8_e4m3fn query tensor's bits (``arrays.query_to_cupy``)."""
    return arrays.query_to_cupy(x, ordered=ordered)[0]


class PreparedCall:
    """A score + top-k call for arrays of fixed shapes (see ``indexer.prepare``).

    Call it as ``prepared(q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens,
    cu_seqlens_q=None, out=None, stream=None, validate=False)``; it returns what
    ``score_topk`` returns. Attributes: ``top_k``, ``precision``, ``return_scores``,
    ``physical``, ``backend`` ('numpy' or 'cuda'), ``shapes`` (name -> prepared shape),
    ``workspace``.

    Calls given ``out=`` on the GPU (CuPy arrays, or PyTorch tensors on PyTorch's current
    stream) are replayed from CUDA graphs: the second call that comes with the same arrays
    (the same pointers, ``out``'s included) captures its launches into a graph kept under
    those pointers, and every later such call replays it on the call's stream, which costs
    the host a graph launch instead of the kernels' launches (docs/performance.md v46), and
    the GPU the select's launches overlapping their predecessors as in any graph. A graph
    reads its arrays when it runs, so new contents at the same pointers are scored anew;
    graphs are dropped when the workspace grows, skipped while the call's stream is itself
    capturing (the launches are then captured into the caller's graph), and kept for up
    to 128 sets of pointers (a layer's pool each, say). ``prepare(..., graphs=False)``
    turns them off. Its calls and replays take their turns on the workspace (``Workspace.turn``),
    so they may come from several streams and threads, run one after another. It
    keeps the CuPy view of the last PyTorch tensor each argument took (and so that tensor)
    until a call passes another.
    """

    def __init__(self, q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, top_k, *, cu_seqlens_q,
                 backend, precision, return_scores, physical, validate, workspace, workspace_budget, graphs=True):
        ops._check_call(precision, workspace, workspace_budget, None, return_scores=return_scores, physical=physical,
                        validate=validate, graphs=graphs)
        self.top_k = _validate.check_top_k(top_k)
        given = (q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens)
        self._grouped = cu_seqlens_q is not None
        if self._grouped:
            given += (cu_seqlens_q,)
        # PyTorch host tensors are taken as NumPy arrays are, where every array is on the host
        taken = ops.host_tensors_as_arrays(_NAMES, given) if arrays.any_torch(given) else given
        # a host array out of C order refused once here, as each call of either backend would
        arrays.check_kinds(_NAMES, taken, in_order=True)
        self.backend = ops._pick_backend(backend, given)
        self.precision, self.return_scores, self.physical = precision, bool(return_scores), bool(physical)
        self.workspace = workspace if workspace is not None else Workspace()
        self._budget = workspace_budget
        self._kinds = tuple(arrays.framework_of(x) for x in given)
        # NumPy arrays by their base class: a memory-mapped array (np.memmap) is one too
        self._signature = tuple((np.ndarray if isinstance(x, np.ndarray) else type(x), tuple(int(n) for n in x.shape),
                                 x.dtype) for x in given)
        self.shapes = {name: sig[1] for name, sig in zip(_NAMES, self._signature)}
        # the short path: every array a CuPy array or a PyTorch CUDA tensor (a KeyPool's CuPy
        # arrays beside a model's tensors, say), on the GPU
        self._fast = self.backend == "cuda" and all(
            kind == "cupy" or (kind == "torch" and getattr(x, "is_cuda", False)) for kind, x in zip(self._kinds, given))
        self._torch_slots = tuple(kind == "torch" for kind in self._kinds)
        # each tensor's side, host or CUDA (a call on the other side is refused by name)
        self._on_cuda = tuple(bool(getattr(x, "is_cuda", False)) for x in given)
        self._any_torch = any(self._torch_slots)
        self._views = [None] * len(given)  # PyTorch: (pointer, CuPy view) of the last tensor a slot took
        self._keep_views = True  # False: hold no tensor between calls (the PyTorch operators' calls)
        # True: the inputs come with no lazy negation bit (the PyTorch operators': their
        # dispatch resolves it), so _match_device need not ask
        self._inputs_resolved = False
        self._graphs_on = self._fast and bool(graphs)
        self._graphs = {}  # pointers -> (CUDA graph of the call's launches, the workspace's generation)
        self._seen = {}  # pointers -> calls that came with them
        self._capture_stream = None
        if self.backend == "numpy":
            self._prob = self._check_host(given, validate)
        else:
            self._prob, self._device, self._plan, self._aligned = self._check_device(taken, validate)  # gpu-only

    def _check_host(self, given, validate):
        """The checks of the NumPy backend's call (values always, as there)."""
        host = [arrays.query_to_numpy(given[0])] + [arrays.to_numpy(x) for x in given[1:]]
        table = host[5]
        if self._grouped:
            T = _validate.query_rows(host[0])
            _validate.check_groups(host[7], host[5], T)
            table = ragged.expand_block_table(host[5], host[7], T)
        return _validate.check_score_topk(*host[:5], table, host[6], self.top_k, values=True)

    def _check_device(self, given, validate):  # gpu-only
        """The GPU call's checks, and its launch plan (the kernels compiled now); ``given``:
        the arrays, host tensors already taken as NumPy arrays (``ops.host_tensors_as_arrays``)."""
        from . import cuda_ops  # noqa: PLC0415  (needs CuPy)

        # the workspace's turn: the grouped call's per-token table is written into it
        with streams.using(None, given), self.workspace.turn():
            ordered = streams.on_torch_stream(given)
            q_view, bits_of = arrays.query_to_cupy(given[0], ordered=ordered)  # a bfloat16 query: its bits
            views = [q_view] + [arrays.to_cupy(x, ordered=ordered) for x in given[1:]]
            table, cu = views[5], None
            if self._grouped:
                cu = views[7]
                T = _validate.query_rows(views[0])
                _validate.check_groups(cu, views[5], T, values=False)
                table = ragged.expand_block_table(views[5], cu, T, workspace=self.workspace)
            prob = _validate.check_score_topk(*views[:5], table, views[6], self.top_k, values=validate,
                                              cu_seqlens=cu, q_bits_of=bits_of)
            cuda_ops.check_key_alignment(prob, views[2], views[3])
            device_id = views[0].data.device_id
            plan = cuda_ops.launch_plan(self.precision, prob, device_id, views[0], views[3],
                                        self._budget, cu)
            # bytes of each array (contiguous, checked every call): out= is kept apart from them
            self._nbytes = tuple(v.nbytes for v in views)
            return prob, device_id, plan, cuda_ops.plan_alignment(views[0].data.ptr, views[3].data.ptr)

    def __repr__(self):
        shapes = ", ".join(f"{k}={v}" for k, v in self.shapes.items())
        return (f"PreparedCall({shapes}, top_k={self.top_k}, backend={self.backend!r}, "
                f"precision={self.precision!r})")

    def __call__(self, q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens, *, cu_seqlens_q=None,
                 out=None, stream=None, validate=False):
        """``score_topk`` on these arrays (of the prepared shapes) with the prepared
        keywords; ``out``, ``stream`` and ``validate`` as ``score_topk`` takes them, but
        ``validate`` is False by default (True runs the whole public call)."""
        if validate is not False:  # (the hot path's one test)
            _validate.check_flag("validate", validate)
        given = (q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens)
        if self._grouped != (cu_seqlens_q is not None):
            raise TypeError("cu_seqlens_q: " + ("this call was prepared with cu_seqlens_q; pass it" if self._grouped
                                                else "this call was prepared without cu_seqlens_q"))
        if self._grouped:
            given += (cu_seqlens_q,)
        self._match(given)
        if validate or not self._fast:
            return self._public(given, out, stream, bool(validate))
        return self._run(given, out, stream)  # gpu-only

    def _match(self, given):
        """Each array against the prepared signature: TypeError or ValueError naming it."""
        for i, x in enumerate(given):
            typ, shape, dtype = self._signature[i]
            if type(x) is not typ and not _numpy_alike(x, typ):  # the exact test first: the hot path
                raise TypeError(f"{_NAMES[i]}: expected a {typ.__module__}.{typ.__name__} as prepared, "
                                f"got {type(x).__module__}.{type(x).__name__}")
            if x.shape != shape:
                raise ValueError(f"{_NAMES[i]}: expected shape {shape} as prepared, got {tuple(x.shape)} "
                                 "(prepare another call for other shapes)")
            if x.dtype is not dtype and x.dtype != dtype:  # (builtin dtypes are singletons)
                raise TypeError(f"{_NAMES[i]}: expected dtype {dtype} as prepared, got {x.dtype}")
            if self._fast:  # else the public call checks the rest
                self._match_device(i, x)
            elif self._torch_slots[i] and bool(x.is_cuda) != self._on_cuda[i]:  # host tensors prepared
                raise ValueError(f"{_NAMES[i]}: expected a tensor on the {'GPU' if self._on_cuda[i] else 'host'} "
                                 f"as prepared, got one on {x.device}")

    def _match_device(self, i, x):  # gpu-only
        """Contiguity and device of input ``i`` (a CuPy array or a PyTorch CUDA tensor), and
        no lazy negation bit on a tensor: its memory holds the values unnegated, and a view or
        a graph kept for its pointer would read them so (a conjugation bit needs a complex
        dtype, which ``_match`` has refused)."""
        tensor = self._torch_slots[i]
        if not (x.is_contiguous() if tensor else arrays.c_contiguous(x)):
            raise ValueError(f"{_NAMES[i]}: expected a C-contiguous array")
        if tensor and not self._inputs_resolved and x.is_neg():
            raise TypeError(f"{_NAMES[i]}: expected a tensor without a lazy negation bit (pass .resolve_neg())")
        where = x.get_device() if tensor else x.data.device_id
        if where != self._device:
            raise ValueError(f"{_NAMES[i]}: expected an array on cuda:{self._device} as prepared, got cuda:{where}")

    def _public(self, given, out, stream, validate):
        """The whole public call (the NumPy backend, other arrays, ``validate=True``)."""
        kwargs = dict(backend=self.backend, precision=self.precision, return_scores=self.return_scores,
                      physical=self.physical, validate=validate, out=out, workspace=self.workspace, stream=stream,
                      workspace_budget=self._budget)
        if self._grouped:
            return ops.score_topk_ragged(*given[:6], given[7], given[6], self.top_k, **kwargs)
        return ops.score_topk(*given, self.top_k, **kwargs)

    def _view(self, i, x, ordered):  # gpu-only
        """A CuPy view of input ``i``: itself for CuPy; for a PyTorch tensor on the call's
        stream, the view of its pointer kept from the last call that passed the same memory
        (its shape and dtype checked equal by ``_match``), else a new one."""
        if not self._torch_slots[i]:
            return x
        convert = _bits_view if i == 0 and self._prob.q_dtype in arrays.BITS_DTYPES else arrays.to_cupy
        if not ordered:  # another stream: DLPack orders the two
            return convert(x)
        ptr = x.data_ptr()
        held = self._views[i]
        if held is not None and held[0] == ptr:
            return held[1]
        view = convert(x, ordered=True)
        if self._keep_views:
            self._views[i] = (ptr, view)
        return view

    def _run(self, given, out, stream):  # gpu-only
        cp = arrays.cupy()
        # without tensors, q alone tells ``using`` the device (every array is on it: _match)
        placed = given if self._any_torch else given[:1]
        # the workspace's turn (a replay's too): calls on other streams or threads run before or after
        with streams.using(stream, placed) as run_on, self.workspace.turn() as turn:  # checks ``stream``
            ordered = self._any_torch and streams.on_torch_stream(given)
            if self._graphs_on and out is not None and ordered == self._any_torch:
                current = run_on if run_on is not None else cp.cuda.get_current_stream()
                if self._replayed(given, out, current, turn.capturing):
                    return outbuf.returned(out, self.return_scores)
            return self._launch(given, out, ordered)

    def _launch(self, given, out, ordered):  # gpu-only
        """The call's launches on the current stream and device."""
        from . import cuda_ops  # noqa: PLC0415  (needs CuPy)

        prob = self._prob
        views = [self._view(i, x, ordered) for i, x in enumerate(given)]
        for name, view in zip(_NAMES, views):  # ~0.1 us an array; a replay's pointers passed here when captured
            arrays.check_element_aligned(name, view)
        cuda_ops.check_key_alignment(prob, views[2], views[3])
        table, cu = views[5], None
        if self._grouped:
            cu = views[7]
            table = ragged.expand_block_table(views[5], cu, prob.T, workspace=self.workspace)
        # a q or key_scale off the prepared 16-byte alignment may take another kernel
        plan = self._plan if cuda_ops.plan_alignment(views[0].data.ptr, views[3].data.ptr) == self._aligned else None
        # out= apart from the inputs here too: the launches that are no replay (another
        # alignment, another stream) never passed _replayed's check
        readers = outbuf.extents(zip(_NAMES, views)) if out is not None else None
        return cuda_ops.run_checked(self.precision, prob, self._device, tuple(views[:5]), table, views[6], cu,
                                    given[0], out, self.return_scores, self.physical, self._budget,
                                    self.workspace, plan=plan, ordered=ordered, readers=readers)

    def _replayed(self, given, out, current, capturing=None):  # gpu-only
        """Whether the call ran as a replay of the CUDA graph of its pointers on stream
        ``current``: captured the second time a set of pointers comes (the first ran
        eagerly and sized the workspace), replayed from then on while the workspace keeps
        its buffers and its histograms are at rest (a graph captured from a call on a
        workspace at rest leaves them so), never while ``current`` is itself capturing
        (``capturing``: False where the caller knows it is not, else None)."""
        if self._any_torch:
            key = tuple(x.data_ptr() if tensor else x.data.ptr for x, tensor in zip(given, self._torch_slots))
        else:
            key = tuple(x.data.ptr for x in given)
        key += self._out_pointers(out)
        held = self._graphs.get(key)
        if held is None:  # (a held graph's pointers had the prepared alignment: the same pointers)
            from . import cuda_ops  # noqa: PLC0415  (needs CuPy)

            if cuda_ops.plan_alignment(key[0], key[3]) != self._aligned:
                return False  # q or key_scale off the prepared alignment: another plan, launched eagerly
            # pointers not replayed yet: out= apart from the inputs (before any capture)
            self._check_apart(key)
        if held is None or held[1] != self.workspace.generation:
            held = None
            seen = self._seen.get(key, 0) + 1
            if len(self._seen) >= _SEEN_MAX:
                self._seen.clear()
            self._seen[key] = seen
            if seen < 2:
                return False
        if self._plan.hist_bytes and not self.workspace.at_rest(self._device):
            return False  # an interrupted call left counts behind: the launches clear them
        if capturing is not False and current.is_capturing():
            return False
        if held is None:
            graph = self._capture(given, out)
            if graph is None:
                return False
            if len(self._graphs) >= _GRAPHS_MAX:
                del self._graphs[next(iter(self._graphs))]  # the oldest
            self._graphs[key] = held = (graph, self.workspace.generation)
        held[0].launch(current)
        return True

    def _capture(self, given, out):  # gpu-only
        """A CUDA graph of the call's launches (captured on a stream of its own, nothing
        run), or None where the capture fails (the call then launches eagerly, and graphs
        are off for this prepared call from then on)."""
        cp = arrays.cupy()
        if self._capture_stream is None:
            self._capture_stream = cp.cuda.Stream(non_blocking=True)
        private = self._capture_stream
        generation = self.workspace.generation
        graph = None
        with private, self.workspace.untracked_capture():  # its graphs are captured again after a growth
            private.begin_capture()
            try:
                # replayed on the call's stream, which orders the tensors: viewed from their pointers
                self._launch(given, out, ordered=self._any_torch)
            except Exception:  # noqa: BLE001  (the eager launch that follows reports a real error)
                self._graphs_on = False
            finally:
                try:
                    graph = private.end_capture()
                except Exception:  # noqa: BLE001  (an invalidated capture: nothing to keep)
                    self._graphs_on = False
        if not self._graphs_on or self.workspace.generation != generation:  # grown meanwhile: stale
            self._graphs_on = False
            return None
        return graph

    def _check_apart(self, key):  # gpu-only
        """``outbuf.check_apart_extents`` from a call's pointers (``_replayed``'s key: the
        inputs', then out's), every array contiguous and of its prepared size."""
        count = len(self._nbytes)
        inputs = [(name, (ptr, ptr + n)) for name, ptr, n in zip(_NAMES, key, self._nbytes)]
        size = self._prob.T * self.top_k * 4  # int32 indices, float32 scores
        names = ("out[0]", "out[1]") if self.return_scores else ("out",)
        outs = [(name, (ptr, ptr + size)) for name, ptr in zip(names, key[count:])]
        outbuf.check_apart_extents(outs, inputs)

    def _out_pointers(self, out):  # gpu-only
        """The pointers of ``out`` (its arrays checked as ``score_topk`` checks them)."""
        typ = self._signature[0][0]
        shape = (self._prob.T, self.top_k)
        names = ("out[0]", "out[1]") if self.return_scores else ("out",)
        parts = outbuf.split(out, self.return_scores)
        pointers = ()
        for name, x, dtype in zip(names, parts, outbuf.OUT_DTYPE_NAMES):
            if type(x) is not typ and not _numpy_alike(x, typ):  # the exact test first: the hot path
                raise TypeError(f"{name}: expected a {typ.__module__}.{typ.__name__} like q, "
                                f"got {type(x).__module__}.{type(x).__name__}")
            if x.shape != shape or arrays.dtype_name(x) != dtype:  # (names kept by dtype object)
                error = TypeError if arrays.dtype_name(x) != dtype else ValueError  # as outbuf's
                raise error(f"{name}: expected {dtype} of shape (T, top_k) = {shape}, "
                            f"got {x.dtype} of shape {tuple(x.shape)}")
            if self._torch_slots[0]:  # out is of q's framework
                if not x.is_contiguous():
                    raise ValueError(f"{name}: expected a C-contiguous array")
                if x.is_neg() or x.requires_grad:  # as the public call refuses it (arrays.torch_refusal)
                    raise TypeError(f"{name}: {arrays.torch_refusal(x)}")
                where, ptr = x.get_device(), x.data_ptr()
            else:
                if not arrays.c_contiguous(x):
                    raise ValueError(f"{name}: expected a C-contiguous array")
                where, ptr = x.data.device_id, x.data.ptr
            if where != self._device:
                raise ValueError(f"{name}: expected an array on cuda:{self._device} (where q is), got cuda:{where}")
            if ptr % 4:  # as score_topk refuses it (arrays.check_element_aligned), before a capture would fail on it
                raise ValueError(f"{name}: expected a device array aligned to its 4-byte elements, "
                                 f"got one at address {ptr:#x}")
            pointers += (ptr,)
        return pointers
