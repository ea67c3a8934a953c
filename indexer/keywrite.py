"""Keys written into a paged NVFP4 pool under the global-scale rule, on the host and the GPU.

The rule (``KeyPool``'s, described in ``indexer.pool``): each block's global decode scale
``g`` is a power of two covering its content; a fresh or all-zero block takes ``g`` from the
keys written into it; keys that overflow a block's capacity ``6 * 448 * g`` grow it, and its
entries are re-expressed exactly (scales divided by 2**m), groups that would leave E4M3's
range re-quantized.

* ``host_write_new`` / ``host_write_into`` / ``host_rescale``: the NumPy form (the
  specification; a host ``KeyPool`` writes through it, and it runs unchanged on CuPy
  arrays, as the GPU pool did before the kernel).
* ``write_blocks``: a GPU ``KeyPool``'s writes, the host's plan of which rows go to which
  block handed to ``kernels/key_write.cu`` (one CTA a block): one launch a call.
* ``write_keys``: the same rule for an engine's own pool arrays, keys addressed by physical
  slot (``block * E + entry``) on the device, with no host planning: a CUDA graph can hold
  it (``validate=False``).

The kernel's encoding (``kernels/nvfp4_encode.cuh``) rounds exactly as ``indexer.nvfp4``, so
the GPU forms write the host form's bytes.
"""

from __future__ import annotations

import math

import numpy as np

from . import _jit, arrays, nvfp4, streams, validate as _validate

__all__ = ["CAPACITY", "MAX_KEY", "PAD_SLOT", "THREADS", "pow2_scales", "check_key_amax", "host_write_new",
           "host_write_into", "host_rescale", "write_blocks", "write_keys"]

#: a block with global scale g holds values up to CAPACITY * g (E2M1's largest times E4M3's)
CAPACITY = nvfp4.E2M1_MAX * nvfp4.E4M3_MAX
#: smallest global scale: a normal float32, never flushed to zero by an FTZ kernel
MIN_EXP = -126
#: largest global scale, and with it the largest key magnitude stored: a block's scale 2**116
#: decodes to at most CAPACITY * 2**116 (~2.2e38); the next power of two could decode a code
#: rounded up past float32's largest
MAX_EXP = 116
MAX_KEY = CAPACITY * 2.0**MAX_EXP
#: bytes of packed codes per 16-element scale group
GROUP_BYTES = nvfp4.GROUP // 2
#: threads a CTA (kernels/key_write.cu's kThreads)
THREADS = 128
#: the slots kernel's element type for each keys dtype (kernels/common.cuh)
_KEY_ELEMENTS = {"float32": "float", "float16": "half_bits", "bfloat16": "bf16_bits"}
_SLOT_TYPES = {"int32": "int", "int64": "long long"}
#: the slot of a padding key: neither written nor checked (vLLM's PAD_SLOT_ID)
PAD_SLOT = -1
#: threads a CTA of the value check (kernels/key_write.cu's key_check_kernel)
_CHECK_THREADS = 256
_NULL = np.uint64(0)  # a null pointer argument


def pow2_scales(amax):
    """The rule's global scales: float64 amax (n,) -> float32 (n,).

    The smallest power of two ``g`` with ``amax <= 6 * 448 * g`` (at least 2**-126), and
    1.0 where amax is 0.
    """
    amax = np.asarray(amax, dtype=np.float64)
    _, e = np.frexp(amax / CAPACITY)  # amax / CAP in [2**(e-1), 2**e)
    # the division rounds: settle the exponent with exact comparisons against CAP * 2**e
    e = np.where(amax > np.ldexp(CAPACITY, e), e + 1, e)
    e = np.where(amax <= np.ldexp(CAPACITY, e - 1), e - 1, e)
    e = np.maximum(e, MIN_EXP)
    return np.where(amax > 0, np.ldexp(1.0, e), 1.0).astype(np.float32)


# ----------------------------------------------------------------------------- the NumPy form
def host_write_new(keys_fp4, key_scale, key_gscale, new, k):
    """Fill the fresh blocks ``new`` (a list of block ids) with the rows of ``k`` (m, D)
    float32, E rows a block, each block's ``g`` from its rows; the last block's tail zeroed."""
    xp = arrays.module_of(keys_fp4)
    E, D = int(keys_fp4.shape[1]), int(keys_fp4.shape[2]) * 2
    # pad to whole blocks: zero rows encode as zero codes and scales, clearing the tail
    padded = xp.zeros((len(new) * E, D), dtype=xp.float32)
    padded[: k.shape[0]] = k
    padded = padded.reshape(len(new), E, D)
    amax = arrays.to_numpy(xp.max(xp.abs(padded), axis=(1, 2)))
    g = xp.asarray(pow2_scales(amax))
    codes, scales, _ = nvfp4.quantize(padded, g[:, None])
    b = xp.asarray(np.asarray(new, dtype=np.int64))
    keys_fp4[b] = codes
    key_scale[b] = scales
    key_gscale[b] = g


def host_write_into(keys_fp4, key_scale, key_gscale, p, used, k):
    """Write ``k`` (h, D) float32 into block ``p`` after its ``used`` entries, growing ``g``
    (and re-expressing the entries) if they overflow it."""
    xp = arrays.module_of(keys_fp4)
    amax = float(xp.max(xp.abs(k)))
    g = float(key_gscale[p])
    if not bool(xp.any(key_scale[p, :used])):
        # only zeros so far: they decode to zero under any g, so take g from the new keys
        g = float(pow2_scales([amax])[0])
    elif amax > CAPACITY * g:
        g_new = float(pow2_scales([amax])[0])
        host_rescale(keys_fp4, key_scale, p, used, g, g_new)
        g = g_new
    codes, scales, _ = nvfp4.quantize(k, np.float32(g))
    keys_fp4[p, used : used + k.shape[0]] = codes
    key_scale[p, used : used + k.shape[0]] = scales
    key_gscale[p] = g


def host_rescale(keys_fp4, key_scale, p, used, g_old, g_new):
    """Re-express the first ``used`` entries of block ``p`` at global scale ``g_new = g_old * 2**m``.

    Scale s -> s / 2**m keeps every decoded value bit-identical where s / 2**m is an
    E4M3 value; the other groups are re-quantized from their exactly decoded values.
    """
    xp = arrays.module_of(keys_fp4)
    m = round(math.log2(g_new / g_old))  # both are powers of two: the ratio is exact
    codes, scales = keys_fp4[p, :used], key_scale[p, :used]
    shifted = nvfp4.e4m3_decode(scales).astype(xp.float64) * 2.0**-m  # exact in float64
    enc = nvfp4.e4m3_encode(shifted.astype(xp.float32))
    exact = nvfp4.e4m3_decode(enc).astype(xp.float64) == shifted  # (used, D/16)
    decoded = nvfp4.dequantize(codes, scales, np.float32(g_old))
    re_codes, re_scales, _ = nvfp4.quantize(decoded, np.float32(g_new))
    key_scale[p, :used] = xp.where(exact, enc, re_scales)
    keys_fp4[p, :used] = xp.where(xp.repeat(exact, GROUP_BYTES, axis=-1), codes, re_codes)


# ----------------------------------------------------------------------------- KeyPool on the GPU
def write_blocks(keys_fp4, key_scale, key_gscale, items, keys):  # gpu-only
    """Write rows of ``keys`` into the pool's blocks, on CuPy's current stream.

    keys_fp4 : CuPy uint8 (P, E, D/2), key_scale : uint8 (P, E, D/16), key_gscale : float32
        (P,): the pool's arrays, C-contiguous, written in place.
    items : flat list of ints, four an item (block, used, first row, count): rows
        ``first .. first + count - 1`` of ``keys`` go after the first ``used`` entries of ``block``.
        Blocks are distinct, ``used + count <= E``, ``count >= 1``; a block with ``used == 0``
        is a fresh one (its entries past the new rows are zeroed).
    keys : CuPy float32 (n, D), C-contiguous, finite, within the pool's largest storable key.
    """
    if not items:
        return
    import cupy as cp  # noqa: PLC0415  (GPU path only)

    E, half = int(keys_fp4.shape[1]), int(keys_fp4.shape[2])
    table = cp.asarray(np.array(items, dtype=np.int32))  # the kernel reads an item as an int4
    kernel = _jit.get_kernel("key_write.cu", "key_write_kernel")
    kernel((len(items) // 4,), (THREADS,),
           (table, keys, np.int32(2 * half), np.int32(E), keys_fp4, key_scale, key_gscale))


# ----------------------------------------------------------------------------- write_keys
def write_keys(keys, slots, keys_fp4, key_scale, key_gscale, *, validate=True, stream=None):
    """Quantize ``keys`` into a paged NVFP4 pool at physical ``slots``, in place, by the
    global-scale rule (a decode step's new keys, into an engine's own pool arrays).

    keys : float32, float16 or bfloat16 (N, D), or (D,) for one key (NumPy, ml_dtypes'
        bfloat16, CuPy, PyTorch). Written as their float32 values.
    slots : int32 or int64 (N,): key i goes to entry ``slots[i] % E`` of block
        ``slots[i] // E`` (``score_topk(..., physical=True)``'s numbering); a slot of -1
        (``PAD_SLOT``) marks a padding key, neither written nor checked (an engine's batch
        padded to a captured size, as vLLM's slot mappings pad); like any break in the
        slots it ends a run (below).
    keys_fp4 : uint8 (P, E, D/2), key_scale : uint8 (P, E, D/16), key_gscale : float32 (P,):
        the pool, C-contiguous, written in place. NumPy arrays take the host form; device
        arrays (CuPy, PyTorch CUDA tensors) one kernel launch (``kernels/key_write.cu``).
    validate : True checks the values: slots in [0, P*E) or -1; each block written by one run
        of keys (below); keys finite and within the largest storable magnitude (~2.2e38); the
        written blocks' ``key_gscale`` powers of two in [2**-126, 2**116]. ValueError naming
        the argument, nothing written. On device arrays that costs one read-back; False
        skips it, so the call neither waits for the GPU nor allocates (with C-contiguous
        device inputs): a CUDA graph can capture it. Unchecked bad values are written as
        garbage, never outside the pool's arrays; an out-of-range slot is skipped. The host
        form (NumPy pool arrays) always checks, ``validate=False`` too: its encoder refuses
        bad keys, and it has no device to wait for.
    stream : where the GPU form runs, as ``score_topk``'s ``stream=``.

    Keys for one block in one call must be one run: consecutive positions with consecutive
    slots (a sequence's new keys are). A run at entry ``e`` joins the block's entries before
    ``e`` (growing the block's ``g`` if it overflows them); a run at entry 0 starts the block
    afresh (its other entries zeroed). So the keys ``KeyPool.append`` calls write, written
    here in the same calls at the slots the pool gave them, give the pool's bytes. (Calls of
    other sizes may not: a block grown key by key re-quantizes what one written whole would
    not.)
    """
    streams.check_stream(stream)
    _validate.check_flag("validate", validate)
    names = ("keys_fp4", "key_scale", "key_gscale")
    pool = (keys_fp4, key_scale, key_gscale)
    on_host = [isinstance(a, np.ndarray) for a in pool]
    if any(on_host) and not all(on_host):
        raise TypeError("keys_fp4, key_scale, key_gscale: expected all NumPy arrays or all device arrays")
    if all(on_host):
        P, E, D = _check_pool(pool, names)
        k = _host_keys(keys, D)
        s = _host_slots(slots, k.shape[0])
        _check_values(k, s, key_gscale, P, E)  # the host form always checks: its encoder refuses bad keys
        _host_write_runs(keys_fp4, key_scale, key_gscale, k, s)
        return None
    arrays.check_kinds(names, pool)  # pragma: no cover  (needs a GPU, as everything below)
    with streams.using(stream, (keys_fp4, keys, slots)):
        return _device_write_keys(keys, slots, pool, names, validate)


def _check_pool(pool, names):
    """(P, E, D) of the pool arrays (NumPy's); TypeError / ValueError naming the argument,
    a read-only one's too (before anything is written)."""
    for name, a in zip(names, pool):
        if not a.flags.writeable:
            raise ValueError(f"{name}: expected a writeable array (it is written in place), got a read-only one")
    return _pool_dims([tuple(a.shape) for a in pool], [arrays.dtype_name(a) for a in pool],
                      [arrays.c_contiguous(a) for a in pool], names)


def _pool_dims(shapes, dtypes, contiguous, names):
    """(P, E, D) of pool arrays of these shapes, dtype names and C-contiguity flags;
    TypeError / ValueError naming the argument."""
    for name, dtype, flat, want in zip(names, dtypes, contiguous, ("uint8", "uint8", "float32")):
        if dtype != want:
            raise TypeError(f"{name}: expected dtype {want}, got {dtype}")
        if not flat:
            raise ValueError(f"{name}: expected a C-contiguous array (it is written in place)")
    codes, scales, gscales = shapes
    if len(codes) != 3 or codes[2] == 0 or codes[2] % GROUP_BYTES:
        raise ValueError(f"keys_fp4: expected shape (P, E, D/2) with D a positive multiple of {nvfp4.GROUP}, "
                         f"got {codes}")
    P, E, D = int(codes[0]), int(codes[1]), int(codes[2]) * 2
    if scales != (P, E, D // nvfp4.GROUP):
        raise ValueError(f"key_scale: expected shape {(P, E, D // nvfp4.GROUP)} for keys_fp4 of shape "
                         f"{codes}, got {scales}")
    if gscales != (P,):
        raise ValueError(f"key_gscale: expected shape ({P},), got {gscales}")
    if E == 0 or P * E > 2**31 - 1:
        raise ValueError(f"keys_fp4: {P} blocks of {E} entries: expected 1 to 2**31 - 1 slots")
    return P, E, D


def _check_key_shape(shape, dtype, D):
    if dtype not in _KEY_ELEMENTS:
        raise TypeError(f"keys: expected dtype float32, float16 or bfloat16, got {dtype}")
    if len(shape) not in (1, 2) or shape[-1] != D:
        raise ValueError(f"keys: expected shape (N, {D}) or ({D},) for the pool's D = {D}, got {tuple(shape)}")


def _check_slot_shape(shape, dtype, N):
    if dtype not in _SLOT_TYPES:
        raise TypeError(f"slots: expected dtype int32 or int64, got {dtype}")
    if tuple(shape) != (N,):
        raise ValueError(f"slots: expected shape ({N},), one slot a key, got {tuple(shape)}")


def _host_keys(keys, D):
    """float32 (N, D) NumPy keys (bfloat16 widened exactly)."""
    if not hasattr(keys, "dtype") or not hasattr(keys, "shape"):
        raise TypeError(f"keys: expected an array, got {type(keys).__name__}")
    _check_key_shape(tuple(keys.shape), arrays.dtype_name(keys), D)
    if arrays.framework_of(keys) == "torch":  # (any layout, as NumPy keys: copied into order below)
        k = keys.detach().cpu().resolve_neg()  # (a lazy negation resolved into the copy)
        k = k.float().numpy() if arrays.dtype_name(keys) == "bfloat16" else k.numpy()
    else:
        k = arrays.to_numpy(keys)
    return np.ascontiguousarray(np.asarray(k).astype(np.float32, copy=False).reshape(-1, D))


def _host_slots(slots, N):
    if not hasattr(slots, "dtype") or not hasattr(slots, "shape"):
        raise TypeError(f"slots: expected an int32 or int64 array, got {type(slots).__name__}")
    _check_slot_shape(tuple(slots.shape), arrays.dtype_name(slots), N)
    return np.asarray(arrays.to_numpy(slots)).astype(np.int64)


def _runs(s, E):
    """Starts of the runs of int64 NumPy slots ``s`` (N,): bool (N,), position i starting one
    unless slot i - 1 is the slot before i in the same block."""
    starts = np.ones(s.shape, dtype=bool)
    if s.shape[0] > 1:
        prev, cur = s[:-1], s[1:]
        starts[1:] = ~((prev >= 0) & (cur == prev + 1) & (cur // E == prev // E))
    return starts


def check_key_amax(amax):
    """ValueError for keys whose largest magnitude is ``amax`` (a float; NaN where a key is)
    when they cannot be stored: NaN or Inf, or above ``MAX_KEY``."""
    if not math.isfinite(amax):
        raise ValueError("keys: NaN or Inf cannot be encoded")
    if amax > MAX_KEY:
        raise ValueError(f"keys: magnitudes above {MAX_KEY:.4g} cannot be stored (their NVFP4 decode could "
                         "overflow float32)")


def _check_values(k, s, key_gscale, P, E):
    """ValueError naming the first bad value of NumPy keys ``k`` (N, D), slots ``s`` (N,)
    and the written blocks' global scales; the messages of both forms."""
    pad = s == PAD_SLOT
    out = np.flatnonzero(~pad & ((s < 0) | (s >= P * E)))
    if out.size:
        i = int(out[0])
        raise ValueError(f"slots: slot {int(s[i])} of key {i} is outside [0, {P * E}) ({P} blocks of {E} entries; "
                         f"{PAD_SLOT} marks a padding key)")
    written = k[~pad]
    check_key_amax(float(np.max(np.abs(written))) if written.size else 0.0)
    starts = np.flatnonzero(_runs(s, E) & ~pad)  # a padding key is a run of its own (the next starts one)
    blocks = s[starts] // E
    order = np.argsort(blocks, kind="stable")
    twice = np.flatnonzero(blocks[order][1:] == blocks[order][:-1])
    if twice.size:
        a, b = starts[order[twice[0]]], starts[order[twice[0] + 1]]
        raise ValueError(f"slots: block {int(s[a] // E)} is written by two runs of keys (from key {int(a)} and from "
                         f"key {int(b)}); a call writes each block's keys as one run of consecutive slots")
    g = np.asarray(key_gscale)[blocks]
    ok = np.isfinite(g) & (g >= 2.0**MIN_EXP) & (g <= 2.0**MAX_EXP) & (np.frexp(g)[0] == 0.5)
    if not ok.all():
        b = int(blocks[np.flatnonzero(~ok)[0]])
        raise ValueError(f"key_gscale: block {b}'s global scale {float(np.asarray(key_gscale)[b])!r} is not a power "
                         f"of two in [2**{MIN_EXP}, 2**{MAX_EXP}] (the rule's)")


def _host_write_runs(keys_fp4, key_scale, key_gscale, k, s):
    """The NumPy form of write_keys: each run through ``host_write_new`` (at entry 0) or
    ``host_write_into``."""
    E = int(keys_fp4.shape[1])
    starts = np.flatnonzero(_runs(s, E)).tolist() + [int(s.shape[0])]
    for a, b in zip(starts[:-1], starts[1:]):
        if s[a] == PAD_SLOT:
            continue
        p, e = divmod(int(s[a]), E)
        if e == 0:
            host_write_new(keys_fp4, key_scale, key_gscale, [p], k[a:b])
        else:
            host_write_into(keys_fp4, key_scale, key_gscale, p, e, k[a:b])


def _device_write_keys(keys, slots, pool, names, validate):  # gpu-only
    """write_keys on device arrays, on the stream ``streams.using`` made current. The kernels
    take the arrays by address (``arrays.device_operand``): PyTorch tensors on PyTorch's
    current stream (the call's, inside streams.using) are read from their attributes, with
    neither a CuPy view (~3-5 us a tensor) nor DLPack's stream handshake."""
    cp = arrays.cupy()
    ordered = streams.on_torch_stream((keys, slots, *pool))
    ops = [arrays.device_operand(a, ordered=ordered, arg=name) for name, a in zip(names, pool)]
    device = ops[0].device
    for name, op in zip(names, ops):
        _check_operand(name, op, device)
    P, E, D = _pool_dims([op.shape for op in ops], [op.dtype for op in ops], [op.contiguous for op in ops], names)
    if not hasattr(keys, "dtype") or not hasattr(keys, "shape"):
        raise TypeError(f"keys: expected an array, got {type(keys).__name__}")
    key_dtype = arrays.dtype_name(keys)
    _check_key_shape(tuple(keys.shape), key_dtype, D)
    if arrays.framework_of(keys) == "torch" and keys.requires_grad:  # gpu-only (PyTorch is not a dependency)
        keys = keys.detach()
    k = arrays.device_operand(keys, ordered=ordered, arg="keys")  # bfloat16 as its bits, read so by the kernel
    N = int(k.shape[0]) if len(k.shape) == 2 else 1
    if not hasattr(slots, "dtype") or not hasattr(slots, "shape"):
        raise TypeError(f"slots: expected an int32 or int64 array, got {type(slots).__name__}")
    _check_slot_shape(tuple(slots.shape), arrays.dtype_name(slots), N)
    s = arrays.device_operand(slots, ordered=ordered, arg="slots")
    for name, op in (("keys", k), ("slots", s)):
        _check_operand(name, op, device)
        if not op.contiguous:
            raise ValueError(f"{name}: expected a C-contiguous array")
    if N == 0:
        return None
    if validate and _device_checks(cp, k, key_dtype, s, ops[2].arg, P, E).any():
        # the host form words the error, from host copies of the caller's arrays (the check's
        # read-back has waited for the call's stream; nothing was written)
        # (arrays of other libraries through their CuPy views: NumPy may not read them)
        k_src, s_src, g_src = (x if arrays.framework_of(x) in ("cupy", "torch") else op.arg
                               for x, op in ((keys, k), (slots, s), (pool[2], ops[2])))
        _check_values(_host_keys(k_src, D), _host_slots(s_src, N), arrays.to_numpy(g_src), P, E)
        raise AssertionError("write_keys: the device check failed where the host check passed")  # pragma: no cover
    kernel = _jit.get_kernel("key_write.cu", f"key_write_slots_kernel<{_SLOT_TYPES[s.dtype]}, "
                                            f"{_KEY_ELEMENTS[key_dtype]}>")
    kernel((N,), (THREADS,), (s.arg, np.int32(N), k.arg, np.int32(D), np.int32(E), np.int32(P),
                              *(op.arg for op in ops)))
    return None


def _check_operand(name, op, device):  # gpu-only
    """ValueError naming an ``arrays.Operand`` on another device than ``device`` (where
    keys_fp4 is) or at an address that is not a multiple of its element size (the kernel
    loads elements whole: ``arrays.check_element_aligned``)."""
    if op.device != device:
        raise ValueError(f"{name}: expected an array on cuda:{device} (where keys_fp4 is), got cuda:{op.device}")
    if op.ptr % op.itemsize:
        raise ValueError(f"{name}: expected a device array aligned to its {op.itemsize}-byte elements, "
                         f"got one at address {op.ptr:#x}")


def device_keys_storable(k):  # gpu-only
    """Whether C-contiguous float32 CuPy keys are all finite and within MAX_KEY (a GPU
    ``KeyPool``'s check): one launch, one read-back."""
    return not _device_checks(arrays.cupy(), arrays.device_operand(k), "float32")[0]


def _device_checks(cp, k, key_dtype, s=None, key_gscale=_NULL, P=0, E=1):  # gpu-only
    """``key_check_kernel``'s four results (``kernels/key_write.cu``; nonzero where a check
    failed) over keys ``k`` and, with ``s``, slots and the written blocks' scales
    (``key_gscale``: a kernel argument, ``arrays.Operand.arg``); ``k`` and ``s`` are
    ``arrays.Operand``s. One memset, one launch, one read-back, on the current stream."""
    n_slots = 0 if s is None else int(s.shape[0])
    log2_places = max(6, (2 * n_slots).bit_length())  # 2**log2_places > 2 n_slots: the set never fills
    scratch = cp.zeros(4 + (1 << log2_places), dtype=cp.uint64)  # found[4], then the set
    slot_type = "int" if s is None else _SLOT_TYPES[s.dtype]
    kernel = _jit.get_kernel("key_write.cu", f"key_check_kernel<{slot_type}, {_KEY_ELEMENTS[key_dtype]}>")
    size = math.prod(k.shape)
    ctas = max(1, min(1024, -(-size // (4 * _CHECK_THREADS))))
    kernel((ctas,), (_CHECK_THREADS,),
           (_NULL if s is None else s.arg, np.int32(n_slots), k.arg, np.int64(size), np.int32(k.shape[-1]),
            np.int32(E), np.int32(P), key_gscale, np.float32(MAX_KEY), np.int32(MIN_EXP), np.int32(MAX_EXP),
            scratch, np.uint64(scratch.data.ptr + 32), np.int32(log2_places)))  # found, then the set past it
    return scratch[:4].get()  # the one read-back
