// check_values.cu: the value checks of validation (indexer/validate.py) over device arrays,
// in one launch whose result is read back once.
//
// The NumPy form of these checks (valid_lens in range, finite positive global scales, block
// ids of visible blocks in [0, P), cu_seqlens from 0 to T and non-decreasing) costs a CuPy
// kernel and a host synchronisation each on device arrays; here one grid-stride pass finds
// the first offending position of each check. The host reads `found` once and, where a
// check failed, builds its error message from the arrays (the failure path may be slow).
//
// found[c] (zero before the launch): 0 when check c passed, else ~i for the smallest
// offending position i (atomicMax of ~i keeps the smallest; ~i is never 0):
//   c = 0: a row t with valid_lens[t] outside [0, max_len]
//   c = 1: a block p whose key_gscale[p] is not finite and > 0 (NaN fails)
//   c = 2: t * L + j for a visible block j of row t (j * E < valid_lens[t], as in the NumPy
//          form) whose id is outside [0, P)
//   c = 3: cu_seqlens: 0 when cu[0] != 0, B when cu[B] != T, i + 1 when cu[i + 1] < cu[i]
// Arrays of length 0 (or a null cu_seqlens) are skipped.
#include "common.cuh"

__device__ __forceinline__ void note_position(u64* found, int check, long long i) {
    atomicMax(found + check, ~(u64)i);
}

__global__ void check_values_kernel(const int* __restrict__ valid_lens, int T, int max_len,
                                    const float* __restrict__ key_gscale, int P,
                                    const int* __restrict__ block_table, int L, int E,
                                    const int* __restrict__ cu_seqlens, int B, int cu_T,
                                    u64* __restrict__ found)  // [4], zero before the launch
{
    // grid (gx, gy): the block table's rows go over blockIdx.y, each row's visible blocks over
    // the x threads (no division a cell, and only visible cells read); the 1-D checks over all
    // threads
    const int nx = gridDim.x * blockDim.x, x = blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.y * nx;
    const long long first = (long long)blockIdx.y * nx + x;
    if (valid_lens != nullptr) {
        for (long long t = first; t < T; t += stride) {
            const int n = valid_lens[t];
            if (n < 0 || n > max_len) note_position(found, 0, t);
        }
    }
    if (key_gscale != nullptr) {
        for (long long p = first; p < P; p += stride) {
            const float g = key_gscale[p];
            const bool finite = (__float_as_uint(g) & 0x7f800000u) != 0x7f800000u;
            if (!(finite && g > 0.0f)) note_position(found, 1, p);  // NaN fails both
        }
    }
    if (block_table != nullptr && valid_lens != nullptr) {
        for (long long t = blockIdx.y; t < T; t += gridDim.y) {
            // blocks up to ceil(n / E) are visible (none for n <= 0; all L past L * E)
            const long long n = valid_lens[t];
            const long long visible = n <= 0 ? 0 : min((long long)L, (n + E - 1) / E);
            for (long long j = x; j < visible; j += nx) {
                const int id = block_table[t * L + j];
                if (id < 0 || id >= P) note_position(found, 2, t * L + j);
            }
        }
    }
    if (cu_seqlens != nullptr) {
        if (first == 0 && cu_seqlens[0] != 0) note_position(found, 3, 0);
        if (first == 0 && cu_seqlens[B] != cu_T) note_position(found, 3, B);
        for (long long i = first; i < B; i += stride)
            if (cu_seqlens[i + 1] < cu_seqlens[i]) note_position(found, 3, i + 1);
    }
}
