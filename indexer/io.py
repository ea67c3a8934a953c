"""Reading and writing arrays files for the CLI: ``.npz``, ``.safetensors`` and ``.npy``.

Nothing here ever unpickles: ``.npz`` and ``.npy`` files are opened with
``allow_pickle=False``, so a file holding an object array is refused, not executed.
``.safetensors`` needs the optional ``safetensors`` package (``pip install safetensors``).

Every failure to read or write a file is a one-line ``ValueError`` that names the path
and the problem (missing file, unknown extension, truncated or corrupt contents, an
object array, a missing array).

A saved ``KeyPool`` keeps its bookkeeping (UTF-8 JSON) as the uint8 array ``pool_meta`` in
``.npz`` and as the header metadata entry ``pool_meta`` in ``.safetensors`` (where
``KeyPool.save`` puts it). ``read_arrays`` and ``write_arrays`` translate, so a caller
always sees the uint8 array ``pool_meta``, whatever the format. Every format keeps a 0-d
array (``top_k``) 0-d.

The two forms of a ``score`` input file
---------------------------------------
``load_problem`` tells them apart by the presence of an array named ``pool_meta``:

* **arrays form** (no ``pool_meta``): the seven ``score_topk`` arrays under their contract
  names ``q``, ``w``, ``keys_fp4``, ``key_scale``, ``key_gscale``, ``block_table`` and
  ``valid_lens`` (the README's argument table gives their shapes and dtypes);
* **pool form** (``pool_meta`` present): a saved ``KeyPool`` (``KeyPool.save``: arrays
  ``keys_fp4``, ``key_scale``, ``key_gscale`` and the uint8 JSON ``pool_meta``) plus
  ``q`` (T, H, D) of float32, float16, bfloat16 or float8_e4m3fn (the last two in
  ``.safetensors`` only, read through ml_dtypes where it is installed: ``.npz`` keeps
  neither), ``w`` float32 (T, H)
  and ``seqs`` (T,), the id of the pool
  sequence each query row reads. ``seqs`` is an integer array (int ids); in ``.npz`` a
  NumPy string array (dtype ``<U``) also works for str ids (a string of decimal digits
  the pool holds no str id of names the int id, as ``indexer pack`` makes of such array
  names, so one array can name both kinds), ``.safetensors`` holds numbers only. An id
  the pool does not hold is an error (``KeyPool`` itself reads it as
  an empty sequence; on the command line that is almost always a typo). The block table
  and valid lengths come from the pool (``KeyPool.block_table(seqs)``, ``lengths(seqs)``).

**Grouped queries** (``score_topk_ragged``'s form, as in prefill): either form may add
``cu_seqlens_q``, int32 (B+1,) row offsets, so that query rows ``cu_seqlens_q[b] :
cu_seqlens_q[b+1]`` form sequence b. In the arrays form ``block_table`` is then (B, L), one
row per sequence; in the pool form ``seqs`` is (B,), one id per sequence, and an int32
``valid_lens`` (T,) may say how much of its sequence each row sees (``indexer.causal_lens``
makes the causal ones; by default a row sees all of it; the pool form takes ``valid_lens``
only with ``cu_seqlens_q``). ``load_grouped_problem`` returns such an input as
``score_topk_ragged`` takes it; ``load_problem`` returns it per token (each row's table row
gathered from its sequence's). An array a form would leave unused (``seqs`` in the arrays
form, ``block_table`` in the pool form) is refused by name, not ignored.

Either form may carry ``top_k`` as a 0-d or one-element integer array; a ``top_k``
passed to ``load_problem`` wins over it. Arrays are handed on exactly as stored:
shapes and dtypes are checked by ``indexer.validate`` when scoring, never converted here.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import numbers
import os
import re
import stat
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from . import arrays as _arrays, ragged, validate

__all__ = [
    "FORMATS",
    "PROBLEM_NAMES",
    "POOL_QUERY_NAMES",
    "POOL_META",
    "file_format",
    "read_arrays",
    "write_arrays",
    "check_writable",
    "is_pool_form",
    "load_problem",
    "load_grouped_problem",
    "key_sequences",
    "blocks_needed",
]

#: file extensions read and written here
FORMATS = (".npz", ".safetensors", ".npy")
#: the seven arrays of ``score_topk``, in its positional order
PROBLEM_NAMES = ("q", "w", "keys_fp4", "key_scale", "key_gscale", "block_table", "valid_lens")
#: the arrays that sit beside a saved pool in the pool form
POOL_QUERY_NAMES = ("q", "w", "seqs")
#: the row offsets that make either form grouped (``score_topk_ragged``'s ``cu_seqlens_q``)
GROUPING_NAME = "cu_seqlens_q"
#: the saved KeyPool's bookkeeping (UTF-8 JSON): a uint8 array in .npz, metadata in .safetensors
POOL_META = "pool_meta"
_POOL_ARRAYS = ("keys_fp4", "key_scale", "key_gscale", POOL_META)

_INT_ID = re.compile(r"-?[0-9]+")


def file_format(path) -> str:
    """The format of ``path`` from its extension: '.npz', '.safetensors' or '.npy'."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        shown = repr(suffix) if suffix else "no extension"
        raise ValueError(f"{path}: unknown file type ({shown}); expected .npz, .safetensors or .npy")
    return suffix


def _safetensors(path):
    """The optional ``safetensors`` package (with ``safetensors.numpy``), or a clear ValueError."""
    try:
        import safetensors  # noqa: PLC0415  (optional dependency)
        import safetensors.numpy  # noqa: PLC0415, F401
    except ImportError:
        raise ValueError(
            f"{path}: .safetensors files need the 'safetensors' package (pip install safetensors, "
            "and ml_dtypes for bfloat16 and float8 arrays)"
        ) from None
    return safetensors


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def read_arrays(path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz``, ``.safetensors`` or ``.npy`` file, by name.

    An ``.npy`` file gives one array named after the file's stem. Never unpickles: a
    file holding an object array raises ``ValueError``, as do a missing file, an unknown
    extension and a truncated or corrupt file (the message names the path). Arrays come
    back in C order: one NumPy saved in Fortran order (a transpose's, ``w = w_ht.T``) holds
    the same values, and a file's user cannot see its memory layout.
    """
    fmt = file_format(path)
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{path}: no such file")
    if not p.is_file():
        raise ValueError(f"{path}: not a file")
    if fmt == ".safetensors":
        return _read_safetensors(path, p)
    # check the magic first: np.load takes anything else for a pickle
    with open(p, "rb") as f:
        head = f.read(6)
    is_zip, is_npy = head[:2] == b"PK", head == b"\x93NUMPY"
    if fmt == ".npy" and not is_npy:
        problem = "it is an .npz archive, not a single .npy array" if is_zip else "no NumPy .npy header"
        raise ValueError(f"{path}: not a readable .npy file ({problem})")
    if fmt == ".npz" and not is_zip:
        problem = "it is a single .npy array, not an .npz archive" if is_npy else "not a zip archive"
        raise ValueError(f"{path}: not a readable .npz file ({problem})")
    try:
        if fmt == ".npy":
            found = {p.stem: np.load(p, allow_pickle=False)}
        else:
            with np.load(p, allow_pickle=False) as npz:
                found = {name: npz[name] for name in npz.files}
    except MemoryError:  # an array larger than memory, or a corrupt header claiming one
        raise ValueError(f"{path}: an array in it needs more memory than is free (or its header is corrupt)") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        if "allow_pickle" in str(exc):
            raise ValueError(f"{path}: holds an object (pickled) array; refusing to unpickle it") from None
        raise ValueError(f"{path}: not a readable {fmt} file ({_one_line(exc)})") from None
    for name, a in found.items():
        if not isinstance(a, np.ndarray):  # a zip member not written by NumPy comes back as its bytes
            raise ValueError(f"{path}: member {name!r} is not a NumPy .npy array")
        if a.dtype.kind == "V" and a.dtype.names is None:  # how NumPy saves ml_dtypes' bfloat16 and float8
            raise ValueError(f"{path}: array {name!r} holds raw {a.dtype.itemsize}-byte values ({a.dtype.str}), "
                             f"as {fmt} keeps a bfloat16 or float8 array: save it as float32, or in .safetensors")
    return {name: np.asarray(a, order="C") for name, a in found.items()}  # (no copy for C-order arrays)


class _ArrayError(ValueError):
    """A file's array that cannot be read or written, named with the path (as the message says)."""


#: safetensors dtypes that its NumPy reader cannot name (it looks them up on NumPy itself),
#: read here as raw bytes viewed as ml_dtypes' type: a bfloat16 or FP8 query a PyTorch
#: pipeline saved (without ml_dtypes, named with the way to get it)
_ML_DTYPES_TENSORS = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                      "F8_E8M0": "float8_e8m0fnu"}


def _read_safetensors(path, p):
    st = _safetensors(path)
    try:  # NumPy reads safetensors' bfloat16 (a model's saved query) once ml_dtypes has named it
        importlib.import_module("ml_dtypes")  # optional
    except ImportError:
        pass
    try:
        with st.safe_open(str(p), framework="numpy") as f, open(p, "rb") as fh:  # safe_open checks the header
            meta = f.metadata() or {}
            raw = _raw_tensors(fh)
            names = list(f.keys())
            out = {name: _read_raw(path, fh, name, *raw[name]) if raw[name][0] in _ML_DTYPES_TENSORS
                   else _get_tensor(path, f, name, raw[name][0]) for name in names}
    except _ArrayError:
        raise
    except Exception as exc:  # SafetensorError (bad header, truncated data), OSError, ...
        raise ValueError(f"{path}: not a readable .safetensors file ({_one_line(exc)})") from None
    if POOL_META in meta and POOL_META not in out:
        out[POOL_META] = np.frombuffer(meta[POOL_META].encode("utf-8"), dtype=np.uint8).copy()
    return out


def _get_tensor(path, f, name, dtype):
    """Tensor ``name`` through safetensors' NumPy reader, which looks its dtype up on NumPy
    itself: a dtype NumPy has no type for (F4, F6_E2M3, ...) is named with its array."""
    try:
        return f.get_tensor(name)
    except AttributeError:
        raise _ArrayError(f"{path}: array {name!r} has dtype {dtype}, which NumPy has no type for") from None


def _raw_tensors(fh) -> dict:
    """``{name: (dtype, shape, file offset, byte count)}`` from the header of the open
    .safetensors file ``fh``, which ``safe_open`` has already checked (its length, its
    JSON, every offset inside the file)."""
    fh.seek(0)
    n = int.from_bytes(fh.read(8), "little")
    header = json.loads(fh.read(n))
    return {name: (t["dtype"], tuple(t["shape"]), 8 + n + t["data_offsets"][0],
                   t["data_offsets"][1] - t["data_offsets"][0])
            for name, t in header.items() if name != "__metadata__"}


def _read_raw(path, fh, name, dtype, shape, offset, count):
    """Tensor ``name`` of dtype ``dtype`` (a key of ``_ML_DTYPES_TENSORS``) as ml_dtypes'
    array, read from the open file ``fh``."""
    element = _ml_dtype(path, name, _ML_DTYPES_TENSORS[dtype])
    fh.seek(offset)
    data = fh.read(count)
    if len(data) != count:  # the file changed since safe_open checked it
        raise _ArrayError(f"{path}: array {name!r} is cut short ({len(data)} of its {count} bytes)")
    return np.frombuffer(data, dtype=element).reshape(shape).copy()


def _bits_typed_host(path, name, a, kind):
    """A bfloat16 or float8_e4m3fn array (``kind``) as ml_dtypes' NumPy array: itself (or
    JAX's, which NumPy reads as ml_dtypes' too), or a PyTorch tensor's bits viewed as one."""
    if _arrays.framework_of(a) != "torch":
        return _arrays.to_numpy(a)
    bits = _arrays.torch_bits(a.detach().cpu().contiguous(), kind)
    return bits.numpy().view(_ml_dtype(path, name, kind))


def _ml_dtype(path, name, kind):
    """ml_dtypes' type ``kind`` (array ``name`` is of it), or a ValueError naming both."""
    try:
        ml_dtypes = importlib.import_module("ml_dtypes")
    except ImportError:
        ml_dtypes = None
    dtype = getattr(ml_dtypes, kind, None)
    if dtype is None:
        raise _ArrayError(f"{path}: array {name!r} is {kind}, which NumPy holds only through ml_dtypes "
                          "(pip install -U ml_dtypes)")
    return dtype


def write_arrays(path, arrays: dict) -> None:
    """Write ``{name: array}`` to ``path``: ``.npz``, ``.safetensors`` or ``.npy``.

    ``.npy`` holds exactly one array (its name is not stored). ``.npz`` is np.savez's
    format (uncompressed). In ``.safetensors`` a uint8 1-D ``pool_meta`` holding UTF-8
    text is written as header metadata (see the module docstring), so ``KeyPool.load``
    reads a pool written here. Device arrays are copied to the host; object arrays are
    refused (nothing is ever pickled). The file is written next to its final name and
    moved into place, so a failed write leaves no half-written file behind.
    """
    fmt = file_format(path)
    if not isinstance(arrays, dict) or not arrays:
        raise ValueError(f"{path}: nothing to write (expected a non-empty dict of arrays)")
    host = {}
    for name, a in arrays.items():
        if not isinstance(name, str) or not name or "\x00" in name:  # (a zip member's name ends at a NUL)
            raise ValueError(f"{path}: array names must be non-empty strings without NUL, got {name!r}")
        kind = _arrays.dtype_name(a) if getattr(a, "dtype", None) is not None else None  # (a list has none)
        if kind in _arrays.BITS_DTYPES:
            a = _bits_typed_host(path, name, a, kind)
        else:
            try:
                a = _arrays.to_numpy(a)
            except TypeError as exc:  # a PyTorch dtype NumPy has no type for (float8_e5m2, ...)
                raise ValueError(f"{path}: array {name!r} of dtype {kind} cannot be written ({_one_line(exc)})") from None
            except ValueError:  # what NumPy cannot make one array of (a ragged nested list)
                raise ValueError(f"{path}: array {name!r} is a {type(a).__name__} that is not one array") from None
        if fmt != ".safetensors" and not _npy_holds(a.dtype):
            raise ValueError(f"{path}: array {name!r} is {a.dtype}, which {fmt} cannot hold (NumPy saves it as raw "
                             "bytes); use .safetensors")
        if a.dtype.hasobject:
            raise ValueError(f"{path}: array {name!r} is an object array; refusing to pickle it")
        host[name] = a
    if fmt == ".npy" and len(host) != 1:
        raise ValueError(
            f"{path}: a .npy file holds exactly one array, got {len(host)} ({', '.join(host)}); use .npz or .safetensors"
        )
    st = _safetensors(path) if fmt == ".safetensors" else None
    p = Path(path)
    if p.parent and not p.parent.is_dir():
        raise ValueError(f"{path}: folder {str(p.parent)!r} does not exist")
    with replaced_atomically(p) as tmp:
        with open(tmp, "wb") as f:
            if fmt == ".npz":
                _write_npz(f, host)
            elif fmt == ".npy":
                np.save(f, next(iter(host.values())), allow_pickle=False)
        if st is not None:
            tensors, meta = dict(host), None
            pm = tensors.get(POOL_META)
            if pm is not None and pm.dtype == np.uint8 and pm.ndim == 1:
                with contextlib.suppress(UnicodeDecodeError):  # not text: stays a tensor
                    meta = {POOL_META: pm.tobytes().decode("utf-8")}
                    del tensors[POOL_META]
            try:
                # C order kept of any rank (np.ascontiguousarray would make a 0-d array (1,))
                st.numpy.save_file({k: np.require(v, requirements="C") for k, v in tensors.items()}, tmp, metadata=meta)
            except Exception as exc:  # unsupported dtype (strings), ...
                raise ValueError(f"{path}: cannot write as .safetensors ({_one_line(exc)})") from None


def _npy_holds(dtype) -> bool:
    """Whether NumPy's .npy format reads ``dtype`` back as itself (not ml_dtypes' types,
    which it saves as raw bytes)."""
    if dtype.hasobject:
        return True  # refused by name below, as an object array
    try:
        return np.lib.format.descr_to_dtype(np.lib.format.dtype_to_descr(dtype)) == dtype
    except (ValueError, TypeError):
        return False


@contextlib.contextmanager
def replaced_atomically(path):
    """Yield the name of a new temporary file beside ``path``; when the block succeeds, move it
    onto ``path`` (one rename: a reader sees the old file or the new one, never half of one)
    with the replaced file's permissions (or the umask's for a new file); when it fails,
    remove it and leave ``path`` as it was. A symbolic link's target is replaced, not the
    link; the new file is the writer's (owner, hard links: those of a new file)."""
    p = check_writable(path)
    try:
        mode = stat.S_IMODE(os.stat(p).st_mode)  # a file replaced keeps its permissions
    except OSError:
        mode = 0o666 & ~_umask()  # a new file gets the usual ones (mkstemp makes 0600)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:40]}.", suffix=".tmp", dir=p.parent)
    except OSError as exc:  # a folder that takes no new file (a read-only or virtual file system)
        raise type(exc)(f"{path}: cannot write a file in its folder ({exc.strerror})") from None
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path, *, in_place=False, inputs=()) -> Path:
    """The file ``path`` names (through a symbolic link), where a file can be written there
    as far as can be told before writing: OSError naming ``path`` for a missing folder, a
    folder at the path, a read-only file (a rename would replace it: honoured as open() would)
    or a folder that is not writable (``in_place``: the file is written where it is, so a
    writable file there needs no writable folder); ValueError where it is one of the files
    ``inputs`` (paths the command reads: their data would be replaced by its result).
    Commands call it before the work whose result it takes."""
    try:
        p = Path(os.path.realpath(path))
    except ValueError as exc:  # a NUL in the path
        raise ValueError(f"{path!r}: not a usable path ({exc})") from None
    for given in inputs:  # (a missing input is reported as such by its reader)
        if p.exists() and os.path.exists(given) and os.path.samefile(p, given):  # links, hard links too
            raise ValueError(f"{path}: is the input file {given}, which the result would replace; "
                             "write it to another file")
    try:
        if not p.parent.is_dir():
            raise FileNotFoundError(f"{path}: folder {str(p.parent)!r} does not exist")
        if len(os.fsencode(p.name)) > _name_max(p.parent):
            raise OSError(f"{path}: the file name is longer than its file system allows")
        if p.is_dir():
            raise IsADirectoryError(f"{path}: is a folder, not a file")
        if p.exists() and not os.access(p, os.W_OK):
            raise PermissionError(f"{path}: the file is not writable")
        if not (in_place and p.exists()) and not os.access(p.parent, os.W_OK | os.X_OK):
            raise PermissionError(f"{path}: its folder {str(p.parent)!r} is not writable")
    except ValueError as exc:  # a NUL in the path
        raise ValueError(f"{path!r}: not a usable path ({exc})") from None
    return p


def check_format_writable(path) -> None:
    """ValueError naming ``path`` where its format cannot be written here (``.safetensors``
    without the ``safetensors`` package): for commands to call before their work."""
    if file_format(path) == ".safetensors":
        _safetensors(path)


def _name_max(folder) -> int:
    """The longest file name (bytes) ``folder``'s file system takes (255 where it does not say)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):  # (no pathconf on Windows)
        return 255


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_npz(f, host):
    # np.savez's format (an uncompressed zip of .npy members), written member by member so
    # that arrays named 'file' or 'allow_pickle' cannot collide with np.savez's parameters
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, a in host.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(a), allow_pickle=False)


def is_pool_form(arrays: dict) -> bool:
    """True when ``arrays`` hold a saved ``KeyPool`` (an array named ``pool_meta``)."""
    return POOL_META in arrays


def _require(arrays, names, name, hint):
    for n in names:
        if n not in arrays:
            raise ValueError(f"{name}: missing array {n!r} ({hint})")


def _top_k_from(arrays, top_k, name):
    if top_k is not None:
        return top_k
    if "top_k" not in arrays:
        raise ValueError(f"{name}: no top_k given (pass --top-k, or store a 0-d integer array 'top_k' in the file)")
    a = np.asarray(arrays["top_k"])
    if a.size != 1:
        raise ValueError(f"{name}: array 'top_k' must hold one integer, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: array 'top_k' must be an integer array, got dtype {a.dtype}")
    return int(a.reshape(()))


def load_problem(arrays: dict, *, top_k=None, name="input"):
    """The seven ``score_topk`` arrays and ``top_k`` from a dict read by ``read_arrays``.

    Returns ``((q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens), top_k)``.
    With an array ``pool_meta`` the dict is the pool form (a saved ``KeyPool`` plus ``q``,
    ``w`` and ``seqs``); otherwise it must hold the seven arrays under their contract names
    (see the module docstring). A grouped input (``cu_seqlens_q``) comes back per token:
    ``block_table`` (T, L), row t its sequence's (``load_grouped_problem`` keeps the
    grouping instead). ``top_k`` overrides an array ``top_k`` in the dict. ``name`` (the
    file's path) starts every error message. Only presence is checked here (and a grouped
    input's grouping): shapes, dtypes and values are ``indexer.validate``'s job when scoring.
    """
    problem, k, cu_seqlens_q = load_grouped_problem(arrays, top_k=top_k, name=name)
    if cu_seqlens_q is not None:
        per_token = ragged.expand_block_table(problem[5], cu_seqlens_q, int(problem[0].shape[0]))
        problem = (*problem[:5], per_token, problem[6])
    return problem, k


def load_grouped_problem(arrays: dict, *, top_k=None, name="input"):
    """``(problem, top_k, cu_seqlens_q)`` from a dict read by ``read_arrays``: as
    ``load_problem``'s for an input that is not grouped (``cu_seqlens_q`` None); for a
    grouped one (an array ``cu_seqlens_q``, see the module docstring) the arrays as
    ``indexer.score_topk_ragged`` takes them: ``problem``'s ``block_table`` is the int32
    (B, L) table of the sequences, ``cu_seqlens_q`` their int32 (B+1,) row offsets, both
    checked here (``validate.check_groups``: dtype, shape, offsets from 0 to T, never
    decreasing; ValueError / TypeError naming the array).

    An array one form would leave unused is refused by name rather than ignored: ``seqs`` in
    the arrays form, ``block_table`` in the pool form, and there ``valid_lens`` without
    ``cu_seqlens_q``."""
    cu = arrays.get(GROUPING_NAME)
    if is_pool_form(arrays):
        _require(arrays, POOL_QUERY_NAMES, name,
                 "a saved KeyPool needs q (T,H,D), w (T,H) and seqs beside it")
        _refuse_unused(arrays, name, "block_table", "the pool form builds it from seqs and the pool")
        if cu is None:
            _refuse_unused(arrays, name, "valid_lens", "the pool form takes it only with cu_seqlens_q "
                           "(one id in seqs per query row sees all of its sequence)")
        k = _top_k_from(arrays, top_k, name)
        return _pool_problem(arrays, name, cu), k, cu
    _require(arrays, PROBLEM_NAMES, name,
             "expected q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens; or a saved KeyPool with q, w, seqs")
    _refuse_unused(arrays, name, "seqs", "it names a saved pool's sequences, and this file holds no pool_meta")
    k = _top_k_from(arrays, top_k, name)
    problem = tuple(arrays[n] for n in PROBLEM_NAMES)
    if cu is not None:
        _check_grouping(problem[0], problem[5], cu)
    return problem, k, cu


def _refuse_unused(arrays, name, array_name, why):
    if array_name in arrays:
        raise ValueError(f"{name}: {array_name}: not used in this form of input ({why})")


def _check_grouping(q, table, cu):
    """``validate.check_groups`` of a grouped input's (B, L) ``table`` and offsets ``cu``
    against ``q``'s rows (values included: host arrays)."""
    validate.check_groups(cu, table, validate.query_rows(q))


def _sequence_ids(seqs, name, grouped=False):
    seqs = np.asarray(seqs)
    if seqs.ndim != 1:
        per = "sequence (with cu_seqlens_q)" if grouped else "query row"
        raise ValueError(f"{name}: array 'seqs' must be 1-D (one sequence id per {per}), got shape {seqs.shape}")
    if seqs.dtype.kind in "iu":
        return [int(s) for s in seqs]
    if seqs.dtype.kind == "U":
        return [str(s) for s in seqs]
    raise TypeError(f"{name}: array 'seqs' must hold integer (or string) sequence ids, got dtype {seqs.dtype}")


def _load_pool(arrays, name):
    from .pool import KeyPool  # noqa: PLC0415  (only the pool form needs it)

    # only the pool's own arrays: a saved pool holds no others
    pool_arrays = {k: arrays[k] for k in _POOL_ARRAYS if k in arrays}
    try:
        return KeyPool.from_arrays(pool_arrays, name=name)
    except ValueError as exc:
        problem = _one_line(exc).replace(f"{name}: ", "")
        raise ValueError(f"{name}: not a valid saved KeyPool ({problem})") from None


def _pool_problem(arrays, name, cu):
    """The seven arrays of the pool form from the pool's bookkeeping (``KeyPool.block_table``,
    ``lengths`` of ``seqs``' ids): per query row, or for a grouped input (offsets ``cu``) per
    sequence, each row seeing its ``valid_lens`` (within its sequence) or all of it."""
    ids = _sequence_ids(arrays["seqs"], name, grouped=cu is not None)
    pool = _load_pool(arrays, name)
    known = set(pool.sequences)
    # a string of decimal digits names the int id `pack` made of such an array name, unless
    # the pool holds that very string (so one string array can name ids of both kinds)
    ids = [int(s) if isinstance(s, str) and s not in known and _INT_ID.fullmatch(s) else s for s in ids]
    for s in ids:
        if s not in known:
            raise ValueError(f"{name}: seqs: sequence {s!r} is not in the pool (it holds {len(known)} sequences)")
    q, w = arrays["q"], arrays["w"]
    head = (q, w, pool.keys_fp4, pool.key_scale, pool.key_gscale, pool.block_table(ids))
    if cu is None:
        return (*head, pool.lengths(ids))
    if not ids:  # (the table's rows are seqs' ids here)
        raise ValueError(f"{name}: seqs: expected at least one sequence id (one a sequence, with cu_seqlens_q)")
    if np.ndim(cu) == 1 and np.shape(cu)[0] != len(ids) + 1:
        raise ValueError(f"{name}: cu_seqlens_q: expected shape ({len(ids) + 1},), one offset more than seqs "
                         f"has sequence ids ({len(ids)}), got {np.shape(cu)}")
    _check_grouping(q, head[5], cu)
    seq_lens = np.repeat(pool.lengths(ids), np.diff(cu.astype(np.int64)))
    valid_lens = arrays.get("valid_lens", seq_lens)
    validate.check_lens_within(valid_lens, seq_lens, prefix=f"{name}: ")
    return (*head, valid_lens)


def key_sequences(arrays: dict, *, name="keys") -> dict:
    """Key sequences of a ``pack`` input: ``{sequence id: float32 (n, D)}`` in file order.

    Each array is one sequence; a name of decimal digits (an optional leading '-') is an
    int id, any other name a str id. Every array must be float32 and 2-D with one common
    D (nothing is converted). Raises ValueError / TypeError naming ``name`` and the array.
    """
    if not arrays:
        raise ValueError(f"{name}: holds no arrays (expected one float32 (n, D) array per sequence)")
    out = {}
    D = None
    for key, a in arrays.items():
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name}: array {key!r} must be a NumPy array, got {type(a).__name__}")
        if a.ndim != 2:
            raise ValueError(f"{name}: array {key!r} must be 2-D (n, D), got shape {a.shape}")
        if a.dtype != np.float32:
            raise TypeError(f"{name}: array {key!r} must be float32, got {a.dtype}")
        if D is None:
            D = a.shape[1]
        elif a.shape[1] != D:
            raise ValueError(f"{name}: array {key!r} has D = {a.shape[1]}, the first array has D = {D}")
        sid = int(key) if _INT_ID.fullmatch(key) else key
        if sid in out:
            raise ValueError(f"{name}: arrays {key!r} and another name the same sequence id {sid!r}")
        out[sid] = a
    return out


def blocks_needed(sequences: dict, entries_per_block: int) -> int:
    """Pool blocks that ``sequences`` (``{id: (n, D)}``) fill: sum of ceil(n / E)."""
    if isinstance(entries_per_block, bool) or not isinstance(entries_per_block, numbers.Integral):
        raise TypeError(f"entries_per_block: expected an int, got {type(entries_per_block).__name__}")
    if entries_per_block < 1:
        raise ValueError(f"entries_per_block: expected an int >= 1, got {entries_per_block}")
    return sum(math.ceil(a.shape[0] / entries_per_block) for a in sequences.values())
