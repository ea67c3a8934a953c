"""The short-row selects (topk_row_kernel<128, 1024, 16> and <128, 512, 16>: rows of up to
2,048 entries, top-k up to 1,024 or 512) on score rows built to reach each of their paths:
the 512-slot kernel's whole-row buckets and its radix fallback (one function for every
form, reading the row again), the bucketed order of the winners and its sort fallback.
Rows: buckets of spread scores, buckets holding ties (the index decides), plateaus too
large for a bucket, scores over every exponent, outliers, scores near zero (collapsed into
one bucket), spans of a few ulps (large and tiny scores), infinite scores, 32 and 33 ties at
the k-th score, rows shorter than k (padding), NaN scores (never selected; a row of them).
Rows of up to 1,024 entries take the kernels' 8-register form, longer ones the 16-register
form, and the 512-slot kernel's rows of up to 512 entries its 4-register form (512 buckets)
and those of 1,025-1,536 its 12-register form; each test has rows at both sides of each
form's edge (512, 513, 1,024, 1,025, 1,536, 1,537).
Against NumPy: score descending, then index ascending."""

import numpy as np
import pytest

from indexer import arrays
from tests.gpu import requires_gpu, row_topk

pytestmark = [requires_gpu, pytest.mark.gpu]


def _rows(kind, rng, rows, width):
    if kind == "random":
        return rng.standard_normal((rows, width)).astype(np.float32)
    if kind == "small-ties":  # 20 copies of a few values among the winners: buckets with ties
        x = rng.standard_normal((rows, width)).astype(np.float32)
        for r in range(rows):
            x[r, rng.choice(width, 20, replace=False)] = np.float32(2.5)
            x[r, rng.choice(width, 7, replace=False)] = np.float32(3.0)
        return x
    if kind == "plateau":  # 600 equal scores at the top: a bucket past its limit
        x = rng.standard_normal((rows, width)).astype(np.float32) - np.float32(10)
        for r in range(rows):
            x[r, rng.choice(width, 600, replace=False)] = np.float32(0.0)
        return x
    if kind == "exponents":  # magnitudes from 2^-120 to 2^120, both signs
        e = rng.integers(-120, 121, size=(rows, width)).astype(np.float32)
        return (np.sign(rng.standard_normal((rows, width))) * np.exp2(e)).astype(np.float32)
    if kind == "outlier":  # one score far above the rest: the others crowd into a few buckets
        x = rng.standard_normal((rows, width)).astype(np.float32)
        x[:, 5] = np.float32(1e30)
        return x
    if kind == "near-zero":  # scores inside the collapsed (-eps, eps), signed zeros among them
        x = rng.standard_normal((rows, width)).astype(np.float32)
        for r in range(rows):
            pick = rng.choice(width, 40, replace=False)
            x[r, pick[:36]] = (rng.standard_normal(36) * 1e-7).astype(np.float32)
            x[r, pick[36:]] = np.array([0.0, -0.0, 0.0, -0.0], dtype=np.float32)
        return x
    if kind == "ulps":  # winners a few ulps apart: a span of ulps spread over the buckets
        return (np.float32(1.0) + rng.integers(0, 3000, size=(rows, width)) * np.float32(2.0**-23)).astype(np.float32)
    if kind == "tiny-span":  # normal scores near 2^-110 a few ulps apart
        return (np.float32(2.0**-110) * (np.float32(1.0) + rng.integers(0, 3000, size=(rows, width))
                                         * np.float32(2.0**-23))).astype(np.float32)
    if kind == "infinite":  # +-inf and +-3e38 among normal scores
        x = rng.standard_normal((rows, width)).astype(np.float32)
        for r in range(rows):
            pick = rng.choice(width, 8, replace=False)
            x[r, pick] = np.array([np.inf, -np.inf, 3e38, -3e38] * 2, dtype=np.float32)
        return x
    if kind == "wide":  # +-3e38 among normal scores: the widest finite span
        x = rng.standard_normal((rows, width)).astype(np.float32)
        x[:, 3], x[:, 9] = np.float32(3e38), np.float32(-3e38)
        return x
    if kind in ("ties-32", "ties-33"):  # 96 distinct scores on top, then 32 or 33 copies of one:
        # at k = 100 the k-th key's bucket holds them all (ranked by comparison, or the radix
        # select past 32)
        copies = int(kind[-2:])
        x = (rng.standard_normal((rows, width)) - 3).astype(np.float32)
        for r in range(rows):
            pick = rng.choice(width, 96 + copies, replace=False)
            x[r, pick[:96]] = (10 + rng.random(96)).astype(np.float32)
            x[r, pick[96:]] = np.float32(5.0)
        return x
    if kind == "nan":  # row 3 all NaN: nothing selectable
        x = rng.standard_normal((rows, width)).astype(np.float32)
        x[rng.random((rows, width)) < 0.3] = np.nan
        x[3] = np.nan
        return x
    raise ValueError(kind)


def run_row_select(scores, ld, lens, width, top_k, max_k, row_ready=0):
    """(indices, scores) as NumPy arrays of ``topk_row_kernel<128, max_k, 16>`` over rows of
    ``scores`` (a CuPy float32 array, rows ``ld`` entries apart) with lengths ``lens``, up to
    ``width``; logical indices, the outputs first filled with junk. ``row_ready``: the
    kernel's per-row counts (a CuPy uint32 array) or 0 (none: the grid wait)."""
    from indexer import _jit

    cp = arrays.cupy()
    rows = len(lens)
    kernel = _jit.get_kernel("select_fast.cu", f"topk_row_kernel<128, {max_k}, 16>")
    out_idx = cp.full((rows, top_k), 7, dtype=cp.int32)
    out_sc = cp.full((rows, top_k), 7, dtype=cp.float32)
    table = cp.zeros((rows, 1), dtype=cp.int32)
    kernel((rows,), (128,), (scores, np.int64(ld), cp.asarray(lens), np.int32(width), np.int32(top_k),
                             table, np.int32(1), np.int32(width), np.int32(1), np.int32(0), out_idx, out_sc, row_ready))
    return out_idx.get(), out_sc.get()


@pytest.mark.parametrize("kind", ["random", "small-ties", "plateau", "exponents", "outlier", "near-zero", "ulps", "tiny-span",
                                  "infinite", "wide", "ties-32", "ties-33", "nan"])
@pytest.mark.parametrize("max_k, top_k", [(1024, 1), (1024, 100), (1024, 512), (1024, 1024), (512, 1), (512, 100),
                                          (512, 512)])
def test_short_row_select_orders_the_winners_like_numpy(kind, max_k, top_k):
    cp = arrays.cupy()
    rng = np.random.default_rng(top_k * 13 + max_k + len(kind))
    rows, width = 16, 2048
    scores = _rows(kind, rng, rows, width)
    lens = rng.integers(0, width + 1, size=rows).astype(np.int32)
    lens[0], lens[1], lens[2] = width, top_k // 2, 0  # a full row, one short of k, an empty one
    # the longest rows of the 4- and 8-register forms and of three register groups, and the shortest past them
    lens[3:9] = [512, 513, 1024, 1025, 1536, 1537]
    got_idx, got_sc = run_row_select(cp.asarray(scores), width, lens, width, top_k, max_k)
    for r in range(rows):
        want_idx, want_sc = row_topk(scores[r], int(lens[r]), top_k)
        np.testing.assert_array_equal(got_idx[r], want_idx, err_msg=f"row {r} (n = {lens[r]})")
        np.testing.assert_array_equal(got_sc[r], want_sc, err_msg=f"row {r} (n = {lens[r]})")


@pytest.mark.parametrize("max_k, top_k", [(512, 512), (1024, 700)])
@pytest.mark.parametrize("ld_extra, offset", [(1, 1), (2, 0), (4, 1), (0, 0)])
def test_short_row_select_reads_rows_of_any_stride_and_alignment(max_k, top_k, ld_extra, offset):
    """Rows `ld` entries apart from a base `offset` entries into the buffer: 16-byte loads
    only where every row is 16-byte aligned and ld a multiple of 4 (the last case), one entry
    a load otherwise; lengths off multiples of 4 and up to ld's end, the last row included,
    so that a load past a row's entries would show as a wrong answer (or to the sanitizer)."""
    cp = arrays.cupy()
    rng = np.random.default_rng(ld_extra * 7 + offset + top_k)
    rows, width = 12, 2048
    ld = width + ld_extra
    flat = rng.standard_normal(offset + rows * ld).astype(np.float32)
    lens = np.array([width, width - 1, width - 3, 1025, 1023, 513, 3, 0, 1537, 1535, 511, width - 2], dtype=np.int32)
    got_idx, got_sc = run_row_select(cp.asarray(flat)[offset:], ld, lens, width, top_k, max_k)
    for r in range(rows):
        row = flat[offset + r * ld: offset + r * ld + width]
        want_idx, want_sc = row_topk(row, int(lens[r]), top_k)
        np.testing.assert_array_equal(got_idx[r], want_idx, err_msg=f"row {r} (n = {lens[r]}, ld = {ld})")
        np.testing.assert_array_equal(got_sc[r], want_sc, err_msg=f"row {r} (n = {lens[r]}, ld = {ld})")
