// nvfp4_encode.cuh: NVFP4 encoding on the GPU with the NumPy form's exact roundings
// (indexer/nvfp4.py, indexer/pool.py's global-scale rule), for kernels/key_write.cu.
//
// Plain C++ but for the __device__ qualifiers and CUDA's rounding intrinsics: no warp or
// block operations, so tests/test_key_write_rounding.py compiles it with the host's C++
// compiler (the intrinsics mapped to IEEE operations) and checks it against indexer.nvfp4
// value by value, without a GPU.
#pragma once

namespace keywrite {

constexpr float kCapacity = 2688.0f;  // E2M1's largest magnitude (6) x E4M3's (448)
constexpr int kGroup = 16;            // elements a block scale covers

// float32 value of a float8_e4m3fn byte (0x7F / 0xFF: NaN), as nvfp4.E4M3_VALUES
__device__ __forceinline__ float e4m3_value(u32 b) {
    const u32 exp = (b >> 3) & 0xFu, man = b & 0x7u;
    float v;
    if ((b & 0x7Fu) == 0x7Fu) v = __int_as_float(0x7fc00000);
    else if (exp == 0) v = (float)man * 0.001953125f;  // man * 2**-9, exact
    else v = __uint_as_float(((exp + 120u) << 23) | (man << 20));
    return (b & 0x80u) ? -v : v;
}

// E4M3 byte of a float32 x >= 0 (finite): nearest-even, saturating at 448 (0x7E)
__device__ __forceinline__ u32 e4m3_code(float x) {
    if (!(x > 0.0f)) return 0;
    if (x >= 448.0f) return 0x7Eu;
    if (x < 0.015625f) return (u32)__float2int_rn(x * 512.0f);  // subnormal steps of 2**-9; 8 is 2**-6
    const u32 bits = __float_as_uint(x);
    u32 code = (bits >> 20) - (120u << 3);  // exponent rebiased 127 -> 7, three mantissa bits kept
    const u32 rest = bits & 0xFFFFFu;
    if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;  // carries into the exponent
    return min(code, 0x7Eu);
}

// E2M1 value of a 4-bit code, as nvfp4.E2M1_VALUES
__device__ __forceinline__ float e2m1_value(u32 code) {
    const u32 mag = code & 7u;
    const float v = mag < 4u ? 0.5f * (float)mag : (mag == 7u ? 6.0f : (float)(mag - 2u));
    return (code & 8u) ? -v : v;
}

// 4-bit E2M1 code of a finite float32: nearest-even, saturating at 6, sign bit for -0.0 too
// (nvfp4.e2m1_encode: the boundaries between magnitudes, reached at equality only where the
// code above is even)
__device__ __forceinline__ u32 e2m1_code(float y) {
    const float a = fabsf(y);
    const u32 mag = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
    return mag | (signbit(y) ? 8u : 0u);
}

// The policy's global scale (pool._pow2_scales): the smallest power of two g >= 2**-126 with
// amax <= 2688 g, 1 for amax == 0; exponents settled by exact float64 comparisons
__device__ __forceinline__ float pow2_scale(float amax) {
    if (!(amax > 0.0f)) return 1.0f;
    const double a = (double)amax;
    int e;
    frexp(a / (double)kCapacity, &e);
    if (a > ldexp((double)kCapacity, e)) ++e;
    if (a <= ldexp((double)kCapacity, e - 1)) --e;
    return (float)ldexp(1.0, max(e, -126));
}

// One 16-element group quantized at global scale g (nvfp4.quantize): its scale byte, and its
// codes packed two a byte (element 2j in the low nibble) into 8 bytes at `codes`
__device__ __forceinline__ u32 quantize_group(const float (&v)[kGroup], float g, u8* codes) {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kGroup; ++j) amax = fmaxf(amax, fabsf(v[j]));
    const float scale = __fdiv_rn(amax, __fmul_rn(6.0f, g));
    const u32 s = e4m3_code(fminf(scale, 448.0f));
    const float denom = __fmul_rn(e4m3_value(s), g);
#pragma unroll
    for (int j = 0; j < kGroup; j += 2) {
        const float y0 = denom > 0.0f ? __fdiv_rn(v[j], denom) : 0.0f;
        const float y1 = denom > 0.0f ? __fdiv_rn(v[j + 1], denom) : 0.0f;
        codes[j / 2] = (u8)(e2m1_code(y0) | (e2m1_code(y1) << 4));
    }
    return s;
}

// One group of a block whose global scale grows from g_old to g = g_old * 2**m (KeyPool's
// _rescale): its scale s becomes s / 2**m where that is an E4M3 value, leaving every decoded
// value unchanged; else the group is re-quantized at g from its exactly decoded values (its
// 8 code bytes at `codes` rewritten). Returns the group's new scale byte.
__device__ __forceinline__ u32 rescale_group(u32 s, float g_old, float g, u8* codes) {
    const double shifted = (double)e4m3_value(s) * ((double)g_old / (double)g);  // exact: a power of two
    const u32 moved = e4m3_code((float)shifted);
    if ((double)e4m3_value(moved) == shifted) return moved;
    const float s_value = e4m3_value(s);
    float v[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup / 2; ++j) {
        const u32 byte = codes[j];
        v[2 * j] = __fmul_rn(__fmul_rn(e2m1_value(byte & 0xFu), s_value), g_old);
        v[2 * j + 1] = __fmul_rn(__fmul_rn(e2m1_value(byte >> 4), s_value), g_old);
    }
    return quantize_group(v, g, codes);
}

}  // namespace keywrite
