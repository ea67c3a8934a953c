"""NVFP4: 4-bit E2M1 elements with one E4M3 scale per 16 elements and a float32 global scale.

The format, exactly as the README's "Storage layout" defines it:

* element code, 4 bits: bit 3 = sign, bits 0-2 = magnitude code meaning
  0, 0.5, 1, 1.5, 2, 3, 4, 6 (E2M1); element ``2j`` sits in bits 0-3 of byte ``j``,
  element ``2j+1`` in bits 4-7;
* block scale: one float8_e4m3fn byte per 16 consecutive elements;
* decode: ``x = (e2m1(code) * e4m3(scale)) * global_scale`` in float32 (the first
  product is exact, so the result is one correctly rounded product);
* encode: ``g = amax / (6 * 448)`` unless given, ``s = e4m3(block_amax / (6 * g))``
  and ``code = e2m1(x / (s * g))``, each rounded to nearest-even and saturating.

Every function here works on NumPy arrays and, unchanged, on CuPy arrays (the array
module is taken from the input), returning the same array type it was given.
"""

from __future__ import annotations

import numpy as np

from . import arrays

__all__ = [
    "E2M1_VALUES",
    "E4M3_MAX",
    "E2M1_MAX",
    "GROUP",
    "e2m1_decode",
    "e2m1_encode",
    "e4m3_decode",
    "e4m3_encode",
    "pack_nibbles",
    "unpack_nibbles",
    "global_scale_for",
    "quantize",
    "dequantize",
]

#: elements that share one E4M3 block scale
GROUP = 16
#: largest finite E4M3 (float8_e4m3fn) value
E4M3_MAX = 448.0
#: largest E2M1 magnitude
E2M1_MAX = 6.0

#: value of each of the 16 E2M1 codes (code 8 is -0.0)
E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)


def _e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 float8_e4m3fn bytes (0x7F and 0xFF are NaN)."""
    b = np.arange(256, dtype=np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    mag = np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * np.exp2(exp - 7.0))
    values = (sign * mag).astype(np.float32)
    values[(b & 0x7F) == 0x7F] = np.nan
    return values


#: value of each of the 256 E4M3 bytes, NaN for 0x7F and 0xFF
E4M3_VALUES = _e4m3_table()
# Non-negative finite codes in increasing order: code i has value _E4M3_POS[i], i = 0..126.
_E4M3_POS = E4M3_VALUES[:127].copy()
# Non-negative E2M1 magnitudes, code i = 0..7.
_E2M1_POS = E2M1_VALUES[:8].copy()
# The midpoints between consecutive magnitudes: |x| above _E2M1_MID[i] rounds to code i + 1
# or higher (at it, only where i + 1 is even).
_E2M1_MID = [float((_E2M1_POS[i] + _E2M1_POS[i + 1]) / 2) for i in range(7)]


def _table(xp, table: np.ndarray):
    """The lookup table on the array module's device (cached per module by CuPy's pool)."""
    return table if xp is np else xp.asarray(table)


def _round_to_table(xp, v, table):
    """Round non-negative float32 ``v`` to the nearest entry of the increasing ``table``.

    Ties go to the even index: in both E2M1 and E4M3 the index is the code and an even
    code has a zero mantissa LSB, so this is round-to-nearest-even. Values beyond the last
    entry saturate to it. Distances are taken in float64, where they are exact.
    """
    t = _table(xp, table)
    hi = xp.clip(xp.searchsorted(t, v, side="left"), 1, t.size - 1)
    lo = hi - 1
    v64 = v.astype(xp.float64)
    d_lo = v64 - t[lo].astype(xp.float64)
    d_hi = t[hi].astype(xp.float64) - v64
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    idx = xp.where(pick_hi, hi, lo)
    idx = xp.where(v >= t[-1], t.size - 1, idx)
    return idx.astype(xp.uint8)


def _int_array(xp, a, name, top):
    """``a`` as an integer array of values 0..``top``; TypeError / ValueError naming ``name``.
    (A uint8 array holding bytes needs no pass over its values.)"""
    a = arrays.as_array(xp, a, name)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {a.dtype}")
    if a.size and not (a.dtype == xp.uint8 and top == 255) and bool((a.min() < 0) | (a.max() > top)):
        raise ValueError(f"{name}: expected values 0 to {top}")
    return a


def _float_array(xp, x, name):
    """``x`` as a float32 array; TypeError naming ``name`` where it holds no real numbers."""
    x = arrays.as_array(xp, x, name)
    if x.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected real numbers, got dtype {x.dtype}")
    return x.astype(xp.float32, copy=False)


def e2m1_decode(codes):
    """float32 value of each 4-bit E2M1 code: the low nibble of each byte of ``codes`` (an
    integer array holding 0..255)."""
    xp = arrays.module_of(codes)
    return _e2m1_values(xp, _int_array(xp, codes, "codes", 255))


def _e2m1_values(xp, codes):
    return _table(xp, E2M1_VALUES)[codes & 0xF]


def e2m1_encode(x):
    """4-bit E2M1 code of float32 ``x``: round to nearest-even, saturating at +-6.

    Negative values (and -0.0) get the sign bit; NaN is refused (ValueError naming ``x``).
    """
    xp = arrays.module_of(x)
    x = _float_array(xp, x, "x")
    if bool(xp.isnan(x).any()):
        raise ValueError("x: NaN has no E2M1 code")
    return _e2m1_codes(xp, x)


def _e2m1_codes(xp, x):
    """``e2m1_encode`` of float32 array ``x`` holding no NaN."""
    a = xp.abs(x)
    # The magnitude code counts the rounding boundaries at or below |x|: the midpoints
    # between neighbouring magnitudes (exact in float32), each reached at equality only
    # where the code above it is even (nearest-even). Seven compares, where a search of the
    # table took ~10x longer (a pool's writes are mostly this).
    mag = xp.zeros(a.shape, dtype=xp.uint8)
    for i, mid in enumerate(_E2M1_MID):
        mag += (a >= mid) if (i + 1) % 2 == 0 else (a > mid)
    return mag | (xp.signbit(x).astype(xp.uint8) << 3)


def e4m3_decode(scale_bytes):
    """float32 value of each float8_e4m3fn byte (an integer array holding 0..255); 0x7F and
    0xFF decode to NaN."""
    xp = arrays.module_of(scale_bytes)
    return _e4m3_values(xp, _int_array(xp, scale_bytes, "scale_bytes", 255))


def _e4m3_values(xp, scale_bytes):
    return _table(xp, E4M3_VALUES)[scale_bytes]


def e4m3_encode(x):
    """float8_e4m3fn byte of non-negative float32 ``x``: nearest-even, saturating at 448.

    Block scales are never negative: a negative value or NaN is refused (ValueError naming ``x``).
    """
    xp = arrays.module_of(x)
    x = _float_array(xp, x, "x")
    if x.size and not bool((x >= 0).all()):  # NaN fails the compare too
        raise ValueError("x: expected values >= 0 (block scales), got a negative value or NaN")
    return _e4m3_bytes(xp, x)


def _e4m3_bytes(xp, x):
    """``e4m3_encode`` of non-negative float32 array ``x``."""
    return _round_to_table(xp, x, _E4M3_POS)


def pack_nibbles(codes):
    """Pack 4-bit codes (..., D) into bytes (..., D/2): element 2j low nibble, 2j+1 high.
    ``codes``: integers 0..15, D even."""
    xp = arrays.module_of(codes)
    codes = _int_array(xp, codes, "codes", 15)
    if codes.ndim < 1 or codes.shape[-1] % 2:
        raise ValueError(f"codes: expected a last dimension of even length, got shape {codes.shape}")
    return _pack(codes)


def _pack(codes):
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def unpack_nibbles(packed):
    """Unpack bytes (..., D/2) into 4-bit codes (..., D), the inverse of ``pack_nibbles``.
    ``packed``: integers 0..255, at least one dimension."""
    xp = arrays.module_of(packed)
    packed = _int_array(xp, packed, "packed", 255)
    if packed.ndim < 1:
        raise ValueError("packed: expected at least one dimension, got a 0-d array")
    return _unpack(xp, packed)


def _unpack(xp, packed):
    out = xp.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=xp.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


def global_scale_for(amax):
    """The standard global decode scale ``amax / (6 * 448)`` in float32, 1 where amax is 0."""
    xp = arrays.module_of(amax)
    amax = _float_array(xp, amax, "amax")
    if amax.size and not bool((xp.isfinite(amax) & (amax >= 0)).all()):
        raise ValueError("amax: expected finite values >= 0")
    return _global_scale(xp, amax)


def _global_scale(xp, amax):
    """``global_scale_for`` of a finite, non-negative float32 ``amax``."""
    g = amax / xp.float32(E2M1_MAX * E4M3_MAX)
    # g = 1 for all-zero data, and also where amax / 2688 underflows to 0 (amax < ~1.9e-42)
    return xp.where(g > 0, g, xp.float32(1.0)).astype(xp.float32)


def _check_global_scale(xp, g, batch_shape):
    """``g`` as float32, a 0-d array or broadcast to ``batch_shape``; finite and > 0."""
    if (g is None or isinstance(g, (str, bytes, complex, bool))
            or getattr(getattr(g, "dtype", None), "kind", "f") in "cSUOb"):
        raise TypeError(f"global_scale: expected a real number or a float array, got {type(g).__name__}")
    try:
        g = xp.asarray(g, dtype=xp.float32)
    except (TypeError, ValueError):
        raise TypeError(f"global_scale: expected a real number or a float array, got {type(g).__name__}") from None
    if g.ndim == 0:
        if not bool(xp.isfinite(g) & (g > 0)):
            raise ValueError(f"global_scale: expected a finite value > 0, got {float(g)}")
        return g
    try:
        g = xp.broadcast_to(g, batch_shape)
    except ValueError:
        raise ValueError(
            f"global_scale: expected a scalar or an array broadcastable to {batch_shape}, "
            f"got shape {g.shape}"
        ) from None
    if not bool(xp.all(xp.isfinite(g) & (g > 0))):
        raise ValueError("global_scale: expected finite values > 0")
    return g


def quantize(x, global_scale=None):
    """Encode float32 values as NVFP4.

    Parameters
    ----------
    x : float32 array (..., D), D a multiple of 16, finite.
    global_scale : None, a scalar, or float32 broadcastable to ``x.shape[:-1]``
        The decode scale. ``None`` computes one for the whole of ``x``:
        ``amax / (6 * 448)`` (1 where ``x`` is all zero).

    Returns
    -------
    codes : uint8 (..., D/2)   packed E2M1 codes
    scales : uint8 (..., D/16) float8_e4m3fn bits of the block scales
    global_scale : float32, a 0-d array when computed or given as a scalar, else the
        given scale broadcast to ``x.shape[:-1]``

    Raises ``ValueError`` for NaN or Inf input, a bad D or a bad global scale.

    The arithmetic is float32's, as NVIDIA's and PyTorch's encoders compute it: the block
    scale is ``e4m3(fl(block_amax / fl(6 * g)))`` and each code ``e2m1(fl(x / fl(s * g)))``,
    each rounded to nearest-even. Where ``g`` is not a power of two, ``fl(6 * g)`` and
    ``fl(s * g)`` round, and a quotient within an ulp of a rounding midpoint can land on the
    other side of it than exact arithmetic would (a scale or code one step apart, its error
    no larger). For a power-of-two ``g`` (``KeyPool``'s rule) the products are exact and each
    quotient rounds once, so an encoder in exact arithmetic agrees byte for byte (short of
    float32's subnormal range).
    """
    xp = arrays.module_of(x)
    x = arrays.as_array(xp, x, "x")
    if x.dtype != xp.float32:
        if not xp.issubdtype(x.dtype, xp.floating):
            raise TypeError(f"x: expected a float32 array, got dtype {x.dtype}")
        x = x.astype(xp.float32)
    if x.ndim < 1 or x.shape[-1] % GROUP != 0 or x.shape[-1] == 0:
        raise ValueError(f"x: last dimension must be a positive multiple of {GROUP}, got shape {x.shape}")
    if not bool(xp.all(xp.isfinite(x))):
        raise ValueError("x: NaN or Inf cannot be encoded as NVFP4")
    batch_shape = x.shape[:-1]
    if global_scale is None:
        amax = xp.max(xp.abs(x)) if x.size else xp.float32(0)
        g_out = _global_scale(xp, xp.asarray(amax, dtype=xp.float32))  # x is finite
        g = g_out
    else:
        g_out = _check_global_scale(xp, global_scale, batch_shape)
        g = g_out
    g_b = xp.broadcast_to(g, batch_shape)[..., None]  # (..., 1)

    groups = x.reshape(batch_shape + (x.shape[-1] // GROUP, GROUP))
    block_amax = xp.max(xp.abs(groups), axis=-1)
    # s = e4m3(block_amax / (6 g)), computed in float32 and saturated before the cast
    scale_f = block_amax / (xp.float32(E2M1_MAX) * g_b)
    scales = _e4m3_bytes(xp, xp.minimum(scale_f, xp.float32(E4M3_MAX)))
    s_dec = _e4m3_values(xp, scales)  # exact float32 value of the stored scale
    denom = (s_dec * g_b)[..., None]  # (..., D/16, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = xp.where(denom > 0, groups / xp.where(denom > 0, denom, xp.float32(1)), xp.float32(0))
    codes = _e2m1_codes(xp, y.astype(xp.float32)).reshape(x.shape)
    return _pack(codes), scales, xp.asarray(g_out, dtype=xp.float32)


def dequantize(codes, scales, global_scale):
    """Decode NVFP4 to float32, bit-exactly: ``(e2m1(code) * e4m3(scale)) * global_scale``.

    Parameters
    ----------
    codes : uint8 (..., D/2)
    scales : uint8 (..., D/16)
    global_scale : scalar or float32 broadcastable to ``codes.shape[:-1]``
        (a pool passes its (P,) scales as (P, 1) for (P, E, D/2) codes)

    Returns float32 (..., D).
    """
    xp = arrays.module_of(codes)
    codes = xp.asarray(codes)
    scales = xp.asarray(scales)
    if codes.dtype != xp.uint8 or scales.dtype != xp.uint8:
        raise TypeError(f"codes, scales: expected uint8, got {codes.dtype} and {scales.dtype}")
    if codes.ndim < 1 or (codes.shape[-1] * 2) % GROUP or codes.shape[-1] == 0:
        raise ValueError(f"codes: expected a last dimension D/2 with D a positive multiple of {GROUP}, "
                         f"got shape {codes.shape}")
    d = codes.shape[-1] * 2
    if scales.shape != codes.shape[:-1] + (d // GROUP,):
        raise ValueError(
            f"scales: expected shape {codes.shape[:-1] + (d // GROUP,)} for codes of shape "
            f"{codes.shape}, got {scales.shape}"
        )
    batch_shape = codes.shape[:-1]
    g = xp.broadcast_to(_check_global_scale(xp, global_scale, batch_shape), batch_shape)
    elems = _e2m1_values(xp, _unpack(xp, codes)).reshape(batch_shape + (d // GROUP, GROUP))
    blockwise = elems * _e4m3_values(xp, scales)[..., None]  # exact in float32
    with np.errstate(over="ignore"):  # a key past float32's range decodes to +-inf (README: "Infinities")
        out = blockwise.reshape(batch_shape + (d,)) * g[..., None]
    return out.astype(xp.float32, copy=False)
