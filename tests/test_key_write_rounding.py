"""The GPU key writer's encoding (kernels/nvfp4_encode.cuh) rounds exactly as indexer.nvfp4 and
KeyPool's global-scale rule, value by value, without a GPU: the header is plain C++ but for
its qualifiers and CUDA's rounding intrinsics, so it is compiled here by the host's C++
compiler with those mapped to IEEE float operations (no contraction, no fast math)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from indexer import _jit, nvfp4
from indexer.keywrite import CAPACITY as _CAPACITY, MAX_KEY as _MAX_KEY, pow2_scales as _pow2_scales
from indexer.pool import KeyPool

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")

SHIMS = r"""
#include <algorithm>
#include <cmath>
#include <cstring>
typedef unsigned char u8;
typedef unsigned int u32;
#define __device__
#define __forceinline__ inline
using std::frexp; using std::ldexp; using std::max; using std::min; using std::signbit;
// volatile: the compiler may not fuse these into an FMA or keep them wider than float32
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }  // nearest-even mode
static inline u32 __float_as_uint(float x) { u32 u; std::memcpy(&u, &x, 4); return u; }
static inline float __uint_as_float(u32 u) { float x; std::memcpy(&x, &u, 4); return x; }
static inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
"""

EXPORTS = r"""
using namespace keywrite;
extern "C" {
void e4m3_codes(const float* x, u32* out, long n) { for (long i = 0; i < n; ++i) out[i] = e4m3_code(x[i]); }
void e4m3_values(const u32* b, float* out, long n) { for (long i = 0; i < n; ++i) out[i] = e4m3_value(b[i]); }
void e2m1_codes(const float* x, u32* out, long n) { for (long i = 0; i < n; ++i) out[i] = e2m1_code(x[i]); }
void e2m1_values(const u32* c, float* out, long n) { for (long i = 0; i < n; ++i) out[i] = e2m1_value(c[i]); }
void pow2_scales(const float* a, float* out, long n) { for (long i = 0; i < n; ++i) out[i] = pow2_scale(a[i]); }
void quantize_groups(const float* x, const float* g, u8* codes, u8* scales, long n) {
    for (long i = 0; i < n; ++i) {
        float v[kGroup];
        for (int j = 0; j < kGroup; ++j) v[j] = x[i * kGroup + j];
        scales[i] = (u8)quantize_group(v, g[i], codes + i * (kGroup / 2));
    }
}
void rescale_groups(u8* codes, u8* scales, float g_old, float g, long n) {
    for (long i = 0; i < n; ++i) scales[i] = (u8)rescale_group(scales[i], g_old, g, codes + i * (kGroup / 2));
}
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("nvfp4_encode")
    src = d / "harness.cpp"
    src.write_text(SHIMS + (_jit.kernel_dir() / "nvfp4_encode.cuh").read_text() + EXPORTS)
    so = d / "harness.so"
    subprocess.run([CXX, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC",
                    str(src), "-o", str(so)], check=True, capture_output=True)
    return ctypes.CDLL(str(so))


def _call(fn, x, out_dtype):
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, dtype=out_dtype)
    fn(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(x.size))
    return out


def _near(values):
    """float32 ``values`` and their neighbours one ulp either side."""
    v = np.asarray(values, dtype=np.float32)
    return np.concatenate([v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf))])


def test_e4m3_decode_equals_the_table(lib):
    got = _call(lib.e4m3_values, np.arange(256, dtype=np.uint32), np.float32)
    np.testing.assert_array_equal(got, nvfp4.E4M3_VALUES)  # NaN where the table has NaN


def test_e4m3_encode_is_nearest_even_and_saturates(lib):
    rng = np.random.default_rng(0)
    pos = nvfp4.E4M3_VALUES[:127].astype(np.float64)
    mids = (pos[1:] + pos[:-1]) / 2  # the ties, exact in float32
    x = np.concatenate([
        _near(pos), _near(mids), _near([448.0, 464.0, 480.0, 1e30, 2.0**-10, 2.0**-149, 2.0**-126]),
        np.exp2(rng.uniform(-160, 12, 100_000)).astype(np.float32), [0.0, np.float32(3.4e38)]]).astype(np.float32)
    x = x[(x >= 0) & np.isfinite(x)]
    got = _call(lib.e4m3_codes, x, np.uint32)
    np.testing.assert_array_equal(got, nvfp4.e4m3_encode(x).astype(np.uint32))


def test_e2m1_encode_and_decode(lib):
    rng = np.random.default_rng(1)
    mags = nvfp4.E2M1_VALUES[:8].astype(np.float64)
    base = np.concatenate([mags, (mags[1:] + mags[:-1]) / 2, [7.0, 1e30, 2.0**-149]])
    x = _near(np.concatenate([base, -base]))
    x = np.concatenate([x, rng.uniform(-8, 8, 50_000).astype(np.float32), np.float32([0.0, -0.0])])
    got = _call(lib.e2m1_codes, x, np.uint32)
    np.testing.assert_array_equal(got, nvfp4.e2m1_encode(x).astype(np.uint32))
    assert got[-1] == 8 and got[-2] == 0  # -0.0 keeps its sign bit
    values = _call(lib.e2m1_values, np.arange(16, dtype=np.uint32), np.float32)
    np.testing.assert_array_equal(values.view(np.uint32), nvfp4.E2M1_VALUES.view(np.uint32))


def test_global_scale_is_the_pools(lib):
    rng = np.random.default_rng(2)
    edges = _CAPACITY * np.exp2(np.arange(-150, 117, dtype=np.float64))
    a = np.concatenate([
        _near(edges[(edges > 1e-45) & (edges < 3.4e38)]), _near([_MAX_KEY, 2.0**-149, 1.0]),
        np.exp2(rng.uniform(-149, 127.9, 50_000)).astype(np.float32), [0.0]]).astype(np.float32)
    a = a[(a >= 0) & (a <= _MAX_KEY)]
    np.testing.assert_array_equal(_call(lib.pow2_scales, a, np.float32), _pow2_scales(a))


def _quantize(lib, x, g):
    n = x.shape[0]
    codes, scales = np.empty((n, 8), np.uint8), np.empty(n, np.uint8)
    lib.quantize_groups(np.ascontiguousarray(x, np.float32).ctypes.data_as(ctypes.c_void_p),
                        np.ascontiguousarray(g, np.float32).ctypes.data_as(ctypes.c_void_p),
                        codes.ctypes.data_as(ctypes.c_void_p), scales.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(n))
    return codes, scales


def test_quantize_groups_equals_nvfp4(lib):
    """Groups at the pool's own scale, at scales far above it (small and E4M3-subnormal block
    scales, as keys appended to a block grown by larger ones), zeros, -0.0, ties on E2M1's
    boundaries, and a group at exactly a block's capacity."""
    rng = np.random.default_rng(3)
    n = 40_000
    x = rng.standard_normal((n, 16)).astype(np.float32) * np.exp2(rng.integers(-60, 60, (n, 1))).astype(np.float32)
    x[::97] = 0.0
    x[1::97, :5] = -0.0
    x[2::97] = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * np.float32(0.5)
    x[3::97, 0] = np.float32(_CAPACITY)
    amax = np.abs(x).max(axis=1)
    g = _pow2_scales(amax) * np.exp2(rng.choice([0, 0, 1, 4, 12, 20], n)).astype(np.float32)
    codes, scales = _quantize(lib, x, g)
    want_codes, want_scales, _ = nvfp4.quantize(x, g)
    np.testing.assert_array_equal(scales, want_scales.reshape(-1))
    np.testing.assert_array_equal(codes, want_codes)
    assert (scales < 8).any() and (scales >= 8).any()  # both E4M3 ranges met


@pytest.mark.parametrize("m", [1, 3, 9, 14, 30])
def test_rescale_groups_equals_the_pools(lib, m):
    """A grown block's groups: the pool's own _rescale (moved scales, re-quantized groups)
    against the header's, byte for byte, with group scales spread so that some leave E4M3."""
    rng = np.random.default_rng(4 + m)
    D, E = 64, 32
    pool = KeyPool(1, entries_per_block=E, head_dim=D)
    x = rng.standard_normal((E, D)).astype(np.float32) * np.exp2(rng.integers(-18, 1, (E, D // 16, 1)).repeat(16, -1)
                                                                  .reshape(E, D)).astype(np.float32)
    pool.append("a", x)
    g_old = float(pool.key_gscale[0])
    codes, scales = pool.keys_fp4[0].copy(), pool.key_scale[0].copy()
    g_new = g_old * 2.0**m
    pool._rescale(0, E, g_old, g_new)
    groups_codes = codes.reshape(-1, 8).copy()  # the harness rewrites them in place
    groups_scales = scales.reshape(-1).copy()
    lib.rescale_groups(groups_codes.ctypes.data_as(ctypes.c_void_p), groups_scales.ctypes.data_as(ctypes.c_void_p),
                       ctypes.c_float(g_old), ctypes.c_float(g_new), ctypes.c_long(groups_scales.size))
    np.testing.assert_array_equal(groups_scales.reshape(E, -1), pool.key_scale[0])
    np.testing.assert_array_equal(groups_codes.reshape(E, -1), pool.keys_fp4[0])
    if m >= 9:  # some groups left E4M3's exact range and were re-quantized
        assert (groups_codes.reshape(E, -1) != codes).any()
