"""The paged NVFP4 key pool: where the indexer's keys live, block by block, as the kernel reads them.

The pool owns ``P`` physical blocks of ``E`` entries (keys) of ``D`` elements each:

==============  =======  ===============  ==============================================
attribute       dtype    shape            meaning
==============  =======  ===============  ==============================================
``keys_fp4``    uint8    (P, E, D/2)      packed E2M1 codes (element 2j in the low nibble)
``key_scale``   uint8    (P, E, D/16)     float8_e4m3fn bits, one scale per 16 elements
``key_gscale``  float32  (P,)             global decode scale per block (1.0 when unused)
==============  =======  ===============  ==============================================

A sequence is a list of physical blocks filled in order; ``block_table`` and ``lengths``
turn a list of sequence ids into the ``block_table`` / ``valid_lens`` arguments of
``indexer.score_topk``. Keys are quantized on write with ``indexer.nvfp4``. The arrays are
NumPy arrays (``device="cpu"``) or CuPy arrays on one GPU (``device="cuda[:N]"``); all
bookkeeping (block lists, lengths, free list) is plain Python on the host. A GPU pool's
appends write every block they touch in one kernel launch (``indexer.keywrite``), byte for
byte what the NumPy form here writes; ``append_many`` takes a decode step's keys for many
sequences in one such launch.

Global-scale policy
-------------------
Each physical block has its own global decode scale ``g``, always a power of two::

    g = 2 ** ceil(log2(amax / (6 * 448)))     (1.0 when amax is 0)

over the block's content, so that the block holds values up to its capacity
``6 * 448 * g`` without saturating (``g`` is kept >= 2**-126, a normal float32, so a
kernel that flushes subnormals still sees ``g > 0``).

* A block taking its first keys (or holding only zeros so far) gets ``g`` from the keys
  written into it.
* Keys appended to a block that already holds data are encoded with the block's ``g``
  (``nvfp4.quantize(keys, g)``). If their amax exceeds the capacity, ``g`` first grows to
  ``g * 2**m`` (smallest ``m`` that covers them) and the block's existing entries are
  rescaled: each 16-element group's E4M3 scale ``s`` becomes ``s / 2**m``. That keeps the
  codes and the decoded values bit-identical whenever ``s / 2**m`` is exactly an E4M3
  value; only groups where it is not (scales ~2**14 below the block's largest, deep in
  E4M3's subnormal range) are re-quantized from their exactly decoded values with the new
  ``g`` (ordinary NVFP4 rounding).

So no value is ever clipped beyond what NVFP4 rounding itself does, and because ``g`` is a
power of two, decode stays the contract's bit-exact ``(e2m1 * e4m3) * g``.

Freed blocks are zeroed (codes, scales, ``g = 1``) and reused LIFO: the most recently
freed blocks are handed out first (they are the likeliest to still sit in cache), a freed
sequence's blocks in their original order. A fresh pool hands out blocks 0, 1, 2, ...
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import re

import numpy as np

from . import arrays, keywrite, nvfp4, ops, streams, validate as _validate
from . import io as _io
from .arrays import as_array

__all__ = ["KeyPool", "PoolFullError"]

#: what ``pool_meta`` names itself, and the version of its layout
FORMAT = "indexer.KeyPool"
FORMAT_VERSION = 1
_ARRAY_NAMES = ("keys_fp4", "key_scale", "key_gscale")
_META_NAME = "pool_meta"

# physical slots (block * E + slot) and lengths are int32 in the kernel's interface
_INT32_MAX = 2**31 - 1


class PoolFullError(RuntimeError):
    """The pool has too few free blocks for an append; the pool was left unchanged."""


def _check_seq(seq, name="seq"):
    """A sequence id: a str, or an int (NumPy integers become int); bool is refused."""
    if type(seq) is str:  # the common cases first: no ABC check (~1 us)
        return seq
    if type(seq) is int and -_SEQ_ID_LIMIT <= seq < _SEQ_ID_LIMIT:
        return seq
    if isinstance(seq, str):  # a subclass (NumPy's str_): kept as the str it is
        return str(seq)
    if isinstance(seq, numbers.Integral) and not isinstance(seq, bool):
        if not -_SEQ_ID_LIMIT <= seq < _SEQ_ID_LIMIT:  # (a 4,300-digit int cannot even be printed)
            raise ValueError(f"{name}: expected an int sequence id within int64, got one of {int(seq).bit_length()} bits")
        return int(seq)
    raise TypeError(f"{name}: expected an int or str sequence id, got {type(seq).__name__} {seq!r}")


_SEQ_ID_LIMIT = 2**63  # int ids are int64's: what a saved pool's JSON and NumPy both hold


def _check_seq_list(seqs):
    """A list of sequence ids from any iterable of ids (a lone id is refused, not iterated)."""
    if isinstance(seqs, (str, bytes, numbers.Integral)):
        raise TypeError(f"seqs: expected a list of sequence ids, got a single {type(seqs).__name__}")
    try:
        items = list(seqs)
    except TypeError:
        raise TypeError(f"seqs: expected a list of sequence ids, got {type(seqs).__name__}") from None
    return [_check_seq(s, "seqs") for s in items]


def _check_counts(counts, B, n):
    """append_many's ``counts``: B ints >= 0 summing to the keys' n rows, as a list of ints."""
    if isinstance(counts, (str, bytes, numbers.Number)):
        raise TypeError(f"counts: expected a list of {B} ints, got {type(counts).__name__}")
    try:
        if hasattr(counts, "shape"):
            values = arrays.to_numpy(counts)
            if values.ndim != 1:
                raise ValueError(f"counts: expected a 1-D array of {B} ints, got shape {values.shape}")
            values = values.tolist()
        else:
            values = list(counts)
    except TypeError:
        raise TypeError(f"counts: expected a list of {B} ints, got {type(counts).__name__}") from None
    if len(values) != B:
        raise ValueError(f"counts: expected {B} counts (one a sequence of seqs), got {len(values)}")
    for c in values:
        if not isinstance(c, numbers.Integral) or isinstance(c, bool):
            raise TypeError(f"counts: expected ints, got {type(c).__name__} {c!r}")
        if c < 0:
            raise ValueError(f"counts: expected counts >= 0, got {c}")
    if sum(values) != n:
        raise ValueError(f"counts: they sum to {sum(values)}, but keys has {n} rows")
    return [int(c) for c in values]


def _check_dims(num_blocks, entries_per_block, head_dim):
    """Validate the pool's shape; TypeError / ValueError naming the argument."""
    for name, v in (("num_blocks", num_blocks), ("entries_per_block", entries_per_block),
                    ("head_dim", head_dim)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__} {v!r}")
        if v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v}")
    if head_dim % 32 or head_dim > _validate.MAX_HEAD_DIM:  # what score_topk takes
        raise ValueError(f"head_dim: expected a positive multiple of 32 up to {_validate.MAX_HEAD_DIM}, got {head_dim}")
    if int(num_blocks) * int(entries_per_block) > _INT32_MAX:  # Python ints: NumPy's would wrap
        raise ValueError(f"num_blocks: {num_blocks} blocks of {entries_per_block} entries exceed the "
                         f"int32 slot range ({_INT32_MAX} entries)")
    return int(num_blocks), int(entries_per_block), int(head_dim)


def _as_path(path) -> str:
    """``path`` (a str, bytes or os.PathLike) as a str; TypeError naming ``path`` otherwise."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}") from None


def _parse_device(device):
    """None for 'cpu', else the CUDA device number of 'cuda' (the current one) or 'cuda:N'."""
    if not isinstance(device, str):
        raise TypeError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {type(device).__name__}")
    if device == "cpu":
        return None
    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    if match is None:
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    cp = arrays.cupy()
    if cp is None:
        raise RuntimeError(f"device={device!r}: CuPy with a usable CUDA GPU is required "
                           "(pip install cupy-cuda13x for CUDA 13 or cupy-cuda12x for CUDA 12)")
    index = cp.cuda.runtime.getDevice() if match.group(1) is None else int(match.group(1))  # pragma: no cover
    count = cp.cuda.runtime.getDeviceCount()  # pragma: no cover
    if index >= count:  # pragma: no cover
        raise ValueError(f"device: {device!r} but only {count} CUDA device(s) are visible")
    return index  # pragma: no cover


def _file_kind(path):
    suffix = path.lower()  # as indexer.io names formats: POOL.NPZ is an .npz file
    if suffix.endswith(".npz"):
        return "npz"
    if suffix.endswith(".safetensors"):
        return "safetensors"
    raise ValueError(f"path: expected a file name ending in .npz or .safetensors, got {path!r}")


def _safetensors():
    """The optional ``safetensors`` package, or an ImportError that says how to get it."""
    try:
        import safetensors  # noqa: PLC0415  (optional dependency, imported on use)
        import safetensors.numpy  # noqa: PLC0415, F401
    except ImportError as e:
        raise ImportError(".safetensors files need the optional 'safetensors' package "
                          "(pip install safetensors)") from e
    return safetensors


def _read_npz(path):
    """All arrays of an .npz (pickles refused) and the ``pool_meta`` bytes (None if absent)."""
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as e:  # a pickle, a truncated zip, not a NumPy file at all, ...
        raise ValueError(f"{path}: not a readable .npz file ({e})") from e
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not an .npz archive (it holds a single .npy array)")
    with data:
        try:
            tensors = {name: data[name] for name in data.files}
        except MemoryError:  # an array larger than memory, or a corrupt header claiming one
            raise ValueError(f"{path}: an array in it needs more memory than is free (or its header is corrupt)") from None
        except Exception as e:  # object arrays: np.load refuses to unpickle them
            raise ValueError(f"{path}: cannot read its arrays without unpickling ({e})") from e
    meta = tensors.pop(_META_NAME, None)
    if meta is None:
        return tensors, None
    if meta.dtype != np.uint8 or meta.ndim != 1:
        raise ValueError(f"{path}: pool_meta: expected a 1-D uint8 array of UTF-8 JSON, got "
                         f"{meta.dtype} {meta.shape}")
    return tensors, meta.tobytes()


def _read_safetensors(path):
    """All tensors of a .safetensors file and its ``pool_meta`` metadata string (None if absent)."""
    st = _safetensors()
    try:
        with st.safe_open(path, framework="numpy") as f:
            meta = (f.metadata() or {}).get(_META_NAME)
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # SafetensorError: bad header, truncated data, ...
        raise ValueError(f"{path}: not a readable .safetensors file ({e})") from e
    return tensors, meta


class KeyPool:
    """A paged pool of NVFP4 index keys: ``num_blocks`` blocks of ``entries_per_block`` keys.

    Parameters
    ----------
    num_blocks : int >= 1                 physical blocks P
    entries_per_block : int >= 1          entries (keys) per block E
    head_dim : int, a multiple of 32 up to 256   elements per key D
    device : 'cpu' (NumPy arrays) or 'cuda' / 'cuda:N' (CuPy arrays on that GPU)

    Attributes (C-contiguous, what ``indexer.score_topk`` takes)
    ------------------------------------------------------------
    keys_fp4 : uint8 (P, E, D/2)      packed E2M1 codes, element 2j in the low nibble
    key_scale : uint8 (P, E, D/16)    float8_e4m3fn block scales
    key_gscale : float32 (P,)         global decode scale per block: a power of two, 1.0
        for unused blocks. Policy (see the module docstring): per block,
        ``g = 2**ceil(log2(amax / (6*448)))`` from the first nonzero keys written into it,
        grown by a power of two (existing entries rescaled exactly, except groups whose
        scale would fall out of E4M3's exact range) when a later key exceeds ``6*448*g``.

    Sequences are identified by ints or strs. A sequence exists from its first non-empty
    ``append`` until ``free``; an id never appended reads as empty (length 0, no blocks).
    Freed blocks are zeroed and reused LIFO.
    """

    def __init__(self, num_blocks, entries_per_block=64, head_dim=128, *, device="cpu"):
        P, E, D = _check_dims(num_blocks, entries_per_block, head_dim)
        self._device_id = _parse_device(device)
        self._xp = np if self._device_id is None else arrays.cupy()
        self.num_blocks, self.entries_per_block, self.head_dim = P, E, D
        self._last_write = None  # a GPU pool's event after its last write: the next waits for it
        self.device = device
        xp = self._xp
        with self._on_device():
            self.keys_fp4 = xp.zeros((P, E, D // 2), dtype=xp.uint8)
            self.key_scale = xp.zeros((P, E, D // nvfp4.GROUP), dtype=xp.uint8)
            self.key_gscale = xp.ones((P,), dtype=xp.float32)
            self._filled()
        # a stack: pop() hands out the last element, so a fresh pool gives 0, 1, 2, ...
        self._free = list(range(P - 1, -1, -1))
        self._blocks = {}  # seq id -> physical blocks in logical order (insertion = first append)
        self._lengths = {}  # seq id -> number of entries

    # ----------------------------------------------------------------- bookkeeping views
    @property
    def free_blocks(self) -> int:
        """Number of blocks on the free list."""
        return len(self._free)

    @property
    def sequences(self):
        """The ids of the sequences holding keys, in order of first append."""
        return list(self._blocks)

    def length(self, seq) -> int:
        """Entries held by ``seq`` (0 for an id that holds none)."""
        return self._lengths.get(_check_seq(seq), 0)

    def lengths(self, seqs):
        """int32 (len(seqs),): the length of each sequence (the kernel's ``valid_lens``)."""
        ids = _check_seq_list(seqs)
        return self._to_xp(np.array([self._lengths.get(s, 0) for s in ids], dtype=np.int32))

    def block_table(self, seqs, width=None):
        """int32 (len(seqs), L): row i lists the physical blocks of ``seqs[i]`` in order, -1 after.

        ``L`` is the largest block count over ``seqs`` (at least 1), or ``width`` when given
        (a fixed width lets a caller reuse one buffer shape; ValueError if too small).
        """
        ids = _check_seq_list(seqs)
        rows = [self._blocks.get(s, ()) for s in ids]
        need = max(1, max((len(r) for r in rows), default=0))
        if width is None:
            width = need
        else:
            if not isinstance(width, numbers.Integral) or isinstance(width, bool):
                raise TypeError(f"width: expected an int, got {type(width).__name__}")
            if width < need:
                raise ValueError(f"width: {width} is too small, a sequence among seqs holds {need} blocks")
            if width * self.entries_per_block > _validate.MAX_ROW_ENTRIES:
                raise ValueError(f"width: {width} blocks of {self.entries_per_block} entries exceed the "
                                 f"{_validate.MAX_ROW_ENTRIES} entries a row can have")
        table = np.full((len(ids), int(width)), -1, dtype=np.int32)
        for i, r in enumerate(rows):
            table[i, : len(r)] = r
        return self._to_xp(table)

    def keys(self, seq):
        """float32 (n, D): the decoded keys of ``seq``, bit-exactly ``nvfp4.dequantize`` of the pool."""
        seq = _check_seq(seq)
        n = self._lengths.get(seq, 0)
        with self._on_device():
            if self._device_id is not None:  # pragma: no cover  (needs a GPU)
                self._after_last_write(self._xp.cuda.get_current_stream())
            b = self._xp.asarray(np.asarray(self._blocks.get(seq, []), dtype=np.int64))
            k = nvfp4.dequantize(self.keys_fp4[b], self.key_scale[b], self.key_gscale[b][:, None])
            return k.reshape(-1, self.head_dim)[:n]

    # ----------------------------------------------------------------- writing
    def append(self, seq, keys, *, stream=None) -> int:
        """Quantize ``keys`` and add them at the end of ``seq``; returns its new length.

        keys : float (n, D) or (D,); NumPy, CuPy, a PyTorch tensor or anything ``np.asarray``
            takes. Float64 is cast to float32, float16 and bfloat16 (PyTorch's, or NumPy's
            through ml_dtypes) widened exactly; integer dtypes are a TypeError, NaN/Inf a
            ValueError. n = 0 is a no-op.
        stream : where a GPU pool's writes run, as ``score_topk``'s ``stream=`` (None:
            PyTorch's current stream when ``keys`` is a PyTorch tensor, else CuPy's current
            stream). They wait for the pool's previous writes, on whatever stream those ran;
            score on the same stream, or order the two, so that the scoring reads the keys
            once written. The other way round is the caller's: a write fills the sequence's
            last block in place (and may rescale it), so a scoring call still reading the
            pool on another stream must be ordered before the append. Checked and ignored on
            the CPU.

        The sequence's last, partly filled block is filled first; then blocks come off the
        free list. Raises PoolFullError, changing nothing, when the free list is too short.
        """
        seq = _check_seq(seq)
        streams.check_stream(stream)
        with self._writing(stream, keys):
            return self._append(seq, keys)

    def _append(self, seq, keys):
        """``append`` on the device and stream ``_writing`` chose."""
        k = self._as_keys(keys)
        return self._append_rows([(seq, int(k.shape[0]))], k)[0]

    def append_many(self, seqs, keys, counts=None, *, stream=None, validate=True):
        """Quantize ``keys`` and add them at the ends of several sequences at once (a decode
        step's new keys); returns int64 (B,): each sequence's new length.

        seqs : B distinct sequence ids (a repeated id is a ValueError).
        keys : float (n, D), as ``append`` takes them: ``seqs[0]``'s rows first, then
            ``seqs[1]``'s, and so on.
        counts : None (one row a sequence: n == B) or B ints >= 0 summing to n.
        stream : as ``append``'s.
        validate : False skips the keys' check for NaN, Inf and magnitudes past the largest
            storable (``append``'s ValueError) on a GPU pool, and with it the one read-back,
            so nothing waits for the GPU. Such keys are then written as garbage codes and
            scales (never outside the blocks the call writes); the shapes, dtypes and counts
            are checked either way, and a host pool checks its keys always.

        The same as ``append(seqs[i], rows of seqs[i])`` for i = 0, 1, ... in order (same
        blocks, same bytes), but all or nothing: a PoolFullError (the free list too short
        for all of them) or a bad argument changes nothing. On a GPU pool every block the
        keys touch is written by one kernel launch (``indexer.keywrite``), after one
        read-back that checks the keys.
        """
        ids = _check_seq_list(seqs)
        if len(set(ids)) != len(ids):
            twice = next(s for i, s in enumerate(ids) if s in ids[:i])
            raise ValueError(f"seqs: {twice!r} appears more than once; pass its keys as one run")
        streams.check_stream(stream)
        _validate.check_flag("validate", validate)
        with self._writing(stream, keys):
            # the host pool checks always: its NumPy encoder refuses such keys part-way through
            k = self._as_keys(keys, check=bool(validate) or self._device_id is None)
            n = int(k.shape[0])
            if counts is None:
                if n != len(ids):
                    raise ValueError(f"keys: {n} rows for {len(ids)} sequences; pass counts= for other than "
                                     "one row a sequence")
                counts = [1] * n
            else:
                counts = _check_counts(counts, len(ids), n)
            return np.asarray(self._append_rows(list(zip(ids, counts)), k), dtype=np.int64)

    def _append_rows(self, requests, k):
        """Append rows of ``k`` (float32 (n, D) of the pool's array library) to sequences:
        ``requests`` lists (seq, count), the rows in that order. Returns the new lengths."""
        E = self.entries_per_block
        plans = []  # (seq, n, length, used, head, blocks needed)
        for seq, n in requests:
            length = self._lengths.get(seq, 0)
            used = length % E  # entries already in the last block (0: it is full, or there is none)
            head = min(n, E - used) if used else 0
            plans.append((seq, n, length, used, head, -(-(n - head) // E)))
        need = sum(plan[-1] for plan in plans)
        if need > len(self._free):
            who = f"append to {requests[0][0]!r}" if len(requests) == 1 else f"append_many to {len(requests)} sequences"
            raise PoolFullError(f"{who}: {int(k.shape[0])} keys need {need} free blocks, "
                                f"the pool has {len(self._free)} free of {self.num_blocks}")
        fresh = self._free[len(self._free) - need:][::-1]  # the free list's last, in pop order
        # items: (block, used, first row, count) for each block written, flat (the kernel's table)
        grants, items, row, taken = [], [], 0, 0
        for seq, n, _, used, head, m in plans:
            new = fresh[taken: taken + m]
            taken += m
            grants.append((row, new))
            if head:
                items += (self._blocks[seq][-1], used, row, head)
            first = row + head
            for b in new:
                items += (b, 0, first, min(E, row + n - first))
                first += E
            row += n
        with self._on_device():
            if self._device_id is None:  # the NumPy form: the sequences one after another
                for (seq, n, _, used, head, _), (first, new) in zip(plans, grants):
                    if head:
                        self._write_into(self._blocks[seq][-1], used, k[first: first + head])
                    if new:
                        self._write_new(new, k[first + head: first + n])
            else:  # pragma: no cover  (needs a GPU)
                self._write_blocks(items, k)
        # the bookkeeping only once the writes went through: a failed write (out of memory)
        # loses no block
        del self._free[len(self._free) - need:]
        lengths = []
        for (seq, n, length, _, _, _), (_, new) in zip(plans, grants):
            if n:
                self._blocks[seq] = self._blocks.get(seq, []) + new
                self._lengths[seq] = length + n
            lengths.append(length + n)
        return lengths

    def _write_blocks(self, items, k):  # pragma: no cover  (needs a GPU)
        """A GPU pool's writes: ``keywrite.write_blocks`` over ``items``, a flat list of
        (block, used, first row, count) of ``k``."""
        keywrite.write_blocks(self.keys_fp4, self.key_scale, self.key_gscale, items, k)

    def free(self, seq, *, stream=None) -> None:
        """Drop ``seq``: its blocks are zeroed (``g`` back to 1.0) and return to the free list.

        stream : where a GPU pool's zeroing runs (None: CuPy's current stream), after the
            pool's previous writes; a scoring call still reading the blocks must be ordered
            before it."""
        seq = _check_seq(seq)
        streams.check_stream(stream)
        if seq not in self._blocks:
            raise ValueError(f"seq: unknown sequence id {seq!r}")
        blocks = self._blocks[seq]
        with self._writing(stream):
            self._zero_blocks(blocks)
        # the bookkeeping once the blocks are zeroed: a failed write (or a stream on another
        # device, refused as the writing starts) leaves the sequence whole
        del self._blocks[seq], self._lengths[seq]
        # LIFO, reversed so that pop() gives them back in the sequence's order
        self._free.extend(reversed(blocks))

    def _zero_blocks(self, blocks):
        """Zero ``blocks`` (codes, scales; global scales back to 1.0), so that freed keys do
        not linger and the next owner starts clean."""
        with self._on_device():
            b = self._xp.asarray(np.asarray(blocks, dtype=np.int64))
            self.keys_fp4[b] = 0
            self.key_scale[b] = 0
            self.key_gscale[b] = 1.0

    @contextlib.contextmanager
    def _writing(self, stream, keys=None):
        """The pool's GPU and the stream its writes run on (``streams.resolve``: ``stream``,
        else PyTorch's current stream when ``keys`` is a tensor, else CuPy's current one),
        ordered after the pool's previous writes, whichever stream they ran on (an event
        recorded after each); nothing on the CPU."""
        if self._device_id is None:
            yield
            return
        with streams.using(stream, (self.keys_fp4,) if keys is None else (self.keys_fp4, keys)):  # pragma: no cover
            self._after_last_write(self._xp.cuda.get_current_stream())
            try:
                yield
            finally:  # a write that failed part-way may still have queued some
                self._last_write = self._xp.cuda.get_current_stream().record()

    def _filled(self):
        """A GPU pool's arrays were just filled on CuPy's current stream (made or loaded):
        the first write, on whatever stream, waits for that as for a write."""
        if self._device_id is not None:  # pragma: no cover  (needs a GPU)
            self._last_write = self._xp.cuda.get_current_stream().record()

    def _after_last_write(self, stream):  # pragma: no cover  (needs a GPU)
        """Make ``stream`` wait for the pool's last write (no-op before the first)."""
        if self._last_write is not None:
            stream.wait_event(self._last_write)

    def _as_keys(self, keys, check=True):
        """``keys`` as a C-contiguous float32 (n, D) array of the pool's array library;
        ``check``: NaN, Inf and too-large magnitudes refused (a read-back on a GPU pool)."""
        if self._device_id is not None:  # pragma: no cover  (needs a GPU)
            # keys on another GPU: refused here (the check and the write launch raw kernels,
            # which would read them through a pointer of the wrong device)
            where = streams.device_of((keys,))  # the current one (the pool's) for host keys
            if where != self._device_id:
                raise ValueError(f"keys: expected an array on cuda:{self._device_id} (the pool's) or on the host, "
                                 f"got one on cuda:{where}")
        if getattr(keys, "dtype", None) is not None and arrays.dtype_name(keys) == "bfloat16":
            keys = self._widen_bfloat16(keys)
        if self._xp is np:
            try:
                k = np.asarray(arrays.to_numpy(keys))
            except (RuntimeError, NotImplementedError) as exc:  # PyTorch's refusal, naming nothing
                arrays.refused(("keys",), (keys,), exc)
            except (ValueError, TypeError) as exc:  # a ragged list
                raise TypeError(f"keys: expected a float array, got a {type(keys).__name__} NumPy cannot read "
                                f"as one ({exc})") from None
        else:  # pragma: no cover  (needs a GPU)
            with self._on_device():  # (inside _writing: a tensor on PyTorch's current stream is viewed by pointer)
                try:
                    k = arrays.to_cupy(keys, ordered=streams.on_torch_stream((keys,)))
                except (RuntimeError, BufferError) as exc:  # a tensor DLPack or to_cupy refuses
                    arrays.refused(("keys",), (keys,), exc)
        if not np.issubdtype(k.dtype, np.floating):
            raise TypeError(f"keys: expected a float array, got dtype {k.dtype}")
        given = tuple(k.shape)  # (named as the caller gave it)
        if k.ndim == 1:
            k = k[None, :]
        if k.ndim != 2 or k.shape[1] != self.head_dim:
            raise ValueError(f"keys: expected shape (n, {self.head_dim}) or ({self.head_dim},), got {given}")
        with self._on_device(), np.errstate(over="ignore"):  # float64 overflow -> Inf, caught below
            k = self._xp.ascontiguousarray(k, dtype=self._xp.float32)
            if not check:
                return k
            if self._xp is not np and k.size and keywrite.device_keys_storable(k):  # pragma: no cover  (GPU)
                return k  # one launch and read-back; a failure is worded below
            keywrite.check_key_amax(float(self._xp.max(self._xp.abs(k))) if k.size else 0.0)  # NaN, Inf show
            if self._xp is not np and k.size:  # pragma: no cover
                raise AssertionError("KeyPool: the device check of the keys failed where the host check passed")
        return k

    def _widen_bfloat16(self, keys):
        """bfloat16 keys (a PyTorch tensor, or a NumPy array of ml_dtypes' type) as float32 of
        the pool's array library, exactly (every bfloat16 is a float32 with 16 zero bits);
        a GPU pool widens them on the device from their bits (CuPy has no bfloat16)."""
        kind = arrays.framework_of(keys)
        if kind == "torch":  # pragma: no cover  (PyTorch is not a dependency)
            keys = keys.detach()
            if self._xp is np:
                return keys.cpu().float().numpy()
        elif self._xp is np:
            if not isinstance(keys, np.ndarray):
                raise TypeError(f"keys: a bfloat16 array of {kind} cannot be read; pass a PyTorch tensor, or float32")
            return keys.astype(np.float32)
        with self._on_device():  # pragma: no cover  (needs a GPU)
            cp = self._xp
            bits, _ = arrays.query_to_cupy(keys, ordered=streams.on_torch_stream((keys,)), arg="keys")
            return (bits.astype(cp.uint32) << 16).view(cp.float32)

    def _write_new(self, new, k):
        """Fill the fresh blocks ``new`` with the rows of ``k`` (m, D), E rows per block."""
        keywrite.host_write_new(self.keys_fp4, self.key_scale, self.key_gscale, new, k)

    def _write_into(self, p, used, k):
        """Write ``k`` (h, D) into block ``p`` after its ``used`` entries, growing ``g`` if needed."""
        keywrite.host_write_into(self.keys_fp4, self.key_scale, self.key_gscale, p, used, k)

    def _rescale(self, p, used, g_old, g_new):
        """Re-express the first ``used`` entries of block ``p`` at ``g_new`` (``keywrite.host_rescale``)."""
        keywrite.host_rescale(self.keys_fp4, self.key_scale, p, used, g_old, g_new)

    # ----------------------------------------------------------------- scoring
    def score_topk(self, q, w, seqs, top_k, *, cu_seqlens_q=None, valid_lens=None, **kwargs):
        """``indexer.score_topk`` over this pool.

        Without ``cu_seqlens_q``: query row t reads sequence ``seqs[t]`` and sees all of it
        (one sequence id per query row, as in decode).

        With ``cu_seqlens_q`` (int32 (B+1,)): queries are grouped as in
        ``indexer.score_topk_ragged``: ``seqs`` holds B sequence ids, rows
        ``cu_seqlens_q[b] : cu_seqlens_q[b+1]`` read ``seqs[b]``, and ``valid_lens`` (int32
        (T,), e.g. from ``indexer.causal_lens``) says how much each row sees (default: the
        whole sequence).

        q : float32, float16, bfloat16 or float8_e4m3fn (T, H, D); w : float32 (T, H). Keyword arguments
        (backend, precision, return_scores, physical, validate, out, workspace, stream,
        workspace_budget) go to the scoring function. Returns int32 indices (T, top_k) (and
        float32 scores with ``return_scores``), or ``out`` itself when given.

        The block table and lengths are built from the host bookkeeping on every call (a
        host-to-device copy for a GPU pool), so this call cannot be captured in a CUDA
        graph; capture ``indexer.score_topk`` on the pool's arrays with your own device
        block table instead (``examples/engine_decode_step.py``).
        """
        if self._xp is not np:  # pragma: no cover  (needs a GPU)
            # the tables are copied to the device on the stream the call runs on (PyTorch's
            # current stream for tensors), so the kernels never read them before they land
            with streams.using(kwargs.get("stream"), (q, w, self.keys_fp4)) as run_on:
                self._after_last_write(self._xp.cuda.get_current_stream())  # the keys written, whichever stream
                if run_on is not None:
                    kwargs["stream"] = run_on
                return self._score_topk(q, w, seqs, top_k, cu_seqlens_q, valid_lens, kwargs)
        return self._score_topk(q, w, seqs, top_k, cu_seqlens_q, valid_lens, kwargs)

    def _score_topk(self, q, w, seqs, top_k, cu_seqlens_q, valid_lens, kwargs):
        ids = _check_seq_list(seqs)
        shape = getattr(q, "shape", ())  # (what has none, a list, the call refuses by name)
        if cu_seqlens_q is None:
            if valid_lens is not None:
                raise ValueError("valid_lens: only taken together with cu_seqlens_q")
            if len(shape) >= 1 and shape[0] != len(ids):
                raise ValueError(f"seqs: expected one sequence id per query row ({shape[0]}), got {len(ids)}")
            return ops.score_topk(q, w, self.keys_fp4, self.key_scale, self.key_gscale,
                                  self.block_table(ids), self.lengths(ids), top_k, **kwargs)
        xp = self._xp
        T = _validate.query_rows(q)  # before the offsets are checked against it
        cu = as_array(xp, cu_seqlens_q, "cu_seqlens_q")
        table = self.block_table(ids)
        # the NumPy backend always checks values (the README): a host call with validate=False too
        if (valid_lens is None or kwargs.get("validate", True) is not False
                or ops._pick_backend(kwargs.get("backend", "auto"), (q, w, self.keys_fp4, self.key_scale,
                                                                     self.key_gscale, table, cu, valid_lens)) == "numpy"):
            # the offsets checked before they size anything: each sequence's length repeated
            # over its rows, the rows' lengths (default) or their bound (valid_lens given:
            # a row seeing past its sequence's end would read entries never written to it)
            _validate.check_cu_seqlens(cu, table, T)
            counts = np.diff(arrays.to_numpy(cu).astype(np.int64))
            seq_lens = np.repeat(arrays.to_numpy(self.lengths(ids)), counts).astype(np.int32)
            if valid_lens is None:
                valid_lens = xp.asarray(seq_lens)
            else:
                _validate.check_lens_within(valid_lens, seq_lens)
        return ops.score_topk_ragged(q, w, self.keys_fp4, self.key_scale, self.key_gscale, table,
                                     cu, valid_lens, top_k, **kwargs)

    # ----------------------------------------------------------------- files
    def save(self, path) -> None:
        """Write the pool to ``path``: ``.npz`` (np.savez) or ``.safetensors`` (optional package).

        Arrays ``keys_fp4``, ``key_scale``, ``key_gscale``; the bookkeeping as JSON, in
        ``.npz`` a uint8 array ``pool_meta``, in ``.safetensors`` the metadata key ``pool_meta``.
        Written to a temporary file beside ``path`` and renamed onto it: a save that fails
        (a full disk, an interrupt) leaves a file already at ``path`` as it was.
        """
        path = _as_path(path)
        kind = _file_kind(path)
        if self._last_write is not None:  # pragma: no cover  (a GPU pool: writes on any stream done)
            self._last_write.synchronize()
        tensors = {name: np.ascontiguousarray(arrays.to_numpy(getattr(self, name))) for name in _ARRAY_NAMES}
        meta = json.dumps(self._meta(), separators=(",", ":"))
        writer = _safetensors() if kind != "npz" else None  # its ImportError before any file is made
        with _io.replaced_atomically(path) as tmp:  # an interrupted save leaves the old file whole
            if writer is None:
                with open(tmp, "wb") as f:  # a file object: np.savez does not rename it
                    np.savez(f, **tensors, **{_META_NAME: np.frombuffer(meta.encode("utf-8"), dtype=np.uint8)})
            else:
                writer.numpy.save_file(tensors, tmp, metadata={_META_NAME: meta})

    @classmethod
    def load(cls, path, *, device="cpu"):
        """Read a pool written by ``save``, validating everything read.

        Raises FileNotFoundError for a missing file and ValueError naming the file and the
        problem for anything inconsistent (arrays, shapes, dtypes, block ids, lengths);
        ``.npz`` files are read with ``allow_pickle=False``.
        """
        path = _as_path(path)
        kind = _file_kind(path)
        _parse_device(device)  # a bad device is the caller's error, not the file's
        if not os.path.isfile(path):
            if os.path.exists(path):
                raise IsADirectoryError(f"{path}: not a file")
            raise FileNotFoundError(f"{path}: no such file")
        tensors, meta = (_read_npz if kind == "npz" else _read_safetensors)(path)
        return cls._from_parts(path, tensors, meta, device)

    def _meta(self):
        """The bookkeeping as a JSON-able dict (what ``save`` writes as ``pool_meta``)."""
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "num_blocks": self.num_blocks,
            "entries_per_block": self.entries_per_block,
            "head_dim": self.head_dim,
            "sequences": [{"id": s, "length": self._lengths[s], "blocks": list(b)}
                          for s, b in self._blocks.items()],
            "free": list(self._free),
        }


    @classmethod
    def from_arrays(cls, arrays, *, device="cpu", name="arrays"):
        """A pool from the arrays of a saved pool already in memory (e.g. read with
        ``indexer.io.read_arrays``): ``keys_fp4``, ``key_scale``, ``key_gscale`` and
        ``pool_meta`` (the uint8 JSON bytes ``save`` writes), validated as ``load`` does;
        ``name`` is used in error messages. The arrays are copied."""
        if not isinstance(arrays, dict):
            raise TypeError(f"arrays: expected a dict of arrays, got {type(arrays).__name__}")
        _parse_device(device)
        # copies: the pool writes them
        tensors = {k: as_array(np, v, f"{name}: {k}", copy=True) for k, v in arrays.items() if k != _META_NAME}
        meta = arrays.get(_META_NAME)
        if meta is not None:
            meta = as_array(np, meta, f"{name}: {_META_NAME}")
            if meta.dtype != np.uint8 or meta.ndim != 1:
                raise ValueError(f"{name}: pool_meta: expected a 1-D uint8 array of UTF-8 JSON, got "
                                 f"{meta.dtype} {meta.shape}")
            meta = meta.tobytes()
        return cls._from_parts(name, tensors, meta, device)

    @classmethod
    def _from_parts(cls, path, tensors, meta_text, device):
        def bad(problem):
            return ValueError(f"{path}: {problem}")

        missing = [n for n in _ARRAY_NAMES if n not in tensors]
        if missing:
            raise bad(f"missing array(s) {missing}")
        extra = sorted(set(tensors) - set(_ARRAY_NAMES))
        if extra:
            raise bad(f"unexpected array(s) {extra}")
        if meta_text is None:
            raise bad(f"missing {_META_NAME}")
        try:
            meta = json.loads(meta_text)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise bad(f"{_META_NAME} is not UTF-8 JSON ({e})") from e
        except RecursionError:  # nesting deeper than the parser's stack: no pool's bookkeeping
            raise bad(f"{_META_NAME}: JSON nested too deeply for a pool's bookkeeping") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
            raise bad(f"{_META_NAME}: expected a {FORMAT!r} object of version {FORMAT_VERSION}")
        try:
            P, E, D = _check_dims(meta.get("num_blocks"), meta.get("entries_per_block"), meta.get("head_dim"))
        except (TypeError, ValueError) as e:
            raise bad(f"{_META_NAME}: {e}") from e

        for name, dtype, shape in (("keys_fp4", np.uint8, (P, E, D // 2)),
                                   ("key_scale", np.uint8, (P, E, D // nvfp4.GROUP)),
                                   ("key_gscale", np.float32, (P,))):
            a = tensors[name]
            if a.dtype != dtype or a.shape != shape:
                raise bad(f"{name}: expected {np.dtype(dtype)} {shape}, got {a.dtype} {a.shape}")
        if np.any(tensors["key_scale"] >= 0x7F):
            raise bad("key_scale: negative or NaN E4M3 scales (bytes >= 0x7F) are never written")
        g = tensors["key_gscale"]
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(g) & (g >= 2.0**keywrite.MIN_EXP) & (g <= 2.0**keywrite.MAX_EXP) & (np.frexp(g)[0] == 0.5)
        if not ok.all():
            raise bad(f"key_gscale: expected powers of two in [2**{keywrite.MIN_EXP}, 2**{keywrite.MAX_EXP}] (what the pool "
                      f"writes), got {g[~ok][:4]}")

        owner = {}  # block -> who holds it, to catch blocks shared or left out

        def claim(b, who):
            if type(b) is not int or not 0 <= b < P:
                raise bad(f"{_META_NAME}: block id {b!r} of {who} is not an int in [0, {P})")
            if b in owner:
                raise bad(f"{_META_NAME}: block {b} belongs to both {owner[b]} and {who}")
            owner[b] = who

        seqs, free = meta.get("sequences"), meta.get("free")
        if not isinstance(seqs, list) or not isinstance(free, list):
            raise bad(f"{_META_NAME}: expected lists 'sequences' and 'free'")
        blocks_of, lengths = {}, {}
        for entry in seqs:
            if not isinstance(entry, dict) or set(entry) != {"id", "length", "blocks"}:
                raise bad(f"{_META_NAME}: a sequence entry must be {{id, length, blocks}}, got {entry!r}")
            sid, n, blocks = entry["id"], entry["length"], entry["blocks"]
            if type(sid) not in (int, str) or sid in blocks_of:
                raise bad(f"{_META_NAME}: sequence id {sid!r} is not a unique int or str")
            if type(sid) is int and not -_SEQ_ID_LIMIT <= sid < _SEQ_ID_LIMIT:  # no call could name it
                raise bad(f"{_META_NAME}: sequence id of {sid.bit_length()} bits, past int64")
            if type(n) is not int or n < 1 or not isinstance(blocks, list) or len(blocks) != -(-n // E):
                raise bad(f"{_META_NAME}: sequence {sid!r}: length {n!r} needs ceil(length / {E}) blocks, "
                          f"got {len(blocks) if isinstance(blocks, list) else blocks!r}")
            for b in blocks:
                claim(b, f"sequence {sid!r}")
            blocks_of[sid], lengths[sid] = list(blocks), n
        for b in free:
            claim(b, "the free list")
        if len(owner) != P:
            lost = sorted(set(range(P)) - set(owner))
            raise bad(f"{_META_NAME}: blocks {lost[:8]} are neither in a sequence nor free")

        pool = cls(P, E, D, device=device)
        with pool._on_device():
            for name in _ARRAY_NAMES:
                setattr(pool, name, pool._xp.ascontiguousarray(pool._xp.asarray(tensors[name])))
            pool._filled()  # the copies, not the constructor's fill, are what a write must follow
        pool._blocks, pool._lengths, pool._free = blocks_of, lengths, list(free)
        return pool

    # ----------------------------------------------------------------- device plumbing
    def _on_device(self):
        """A context that makes this pool's GPU current (nothing on the CPU)."""
        if self._device_id is None:
            return contextlib.nullcontext()
        return self._xp.cuda.Device(self._device_id)  # pragma: no cover

    def _to_xp(self, host):
        """A host NumPy array as an array of the pool's library and device."""
        if self._xp is np:
            return host
        with self._on_device():  # pragma: no cover
            return self._xp.asarray(host)

    def __repr__(self):
        return (f"KeyPool(num_blocks={self.num_blocks}, entries_per_block={self.entries_per_block}, "
                f"head_dim={self.head_dim}, device={self.device!r}, sequences={len(self._blocks)}, "
                f"free_blocks={len(self._free)})")
