"""scripts/probe_timeline.py's host side (CPU): the stamps' summary, and that its point names
and array shape are the ones the kernel sources define."""

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from indexer import _jit

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("probe_timeline", ROOT / "scripts" / "probe_timeline.py")
timeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timeline)


def _stamps(ctas=6, points=3, warps=4):
    return np.zeros((ctas, points, warps), np.uint64)


def test_each_point_is_when_the_latest_warp_passed_it_from_the_earliest_entry():
    s = _stamps()
    base = 10_000_000_000
    for cta in range(6):
        s[cta, 0, :] = base + 100 * cta + np.arange(4)           # entries 0..503 ns after the first
        s[cta, 1, :] = base + 2_000 + 1_000 * cta - 10 * np.arange(4)  # latest warp: warp 0
    s[2, 2, 1] = base + 7_000                                     # one CTA, one warp past point 2
    rows = timeline.summarise(s, ("a", "b", "c"))
    name, n, p0, p50, p100 = rows[0]
    assert (name, n) == ("a", 6) and p0 == pytest.approx(0.003) and p100 == pytest.approx(0.503)
    latest_b = np.array([2_000 + 1_000 * c for c in range(6)]) / 1e3
    assert rows[1][1:] == (6, pytest.approx(latest_b.min()), pytest.approx(np.median(latest_b)),
                           pytest.approx(latest_b.max()))
    assert rows[2][0] == "c" and rows[2][1] == 1 and rows[2][2] == pytest.approx(7.0) == rows[2][4]


def test_a_point_no_cta_passed_reads_nan_and_no_entry_is_an_error():
    s = _stamps()
    s[:, 0, 0] = 5_000
    rows = timeline.summarise(s, ("a", "b", "c"))
    assert rows[1][1] == 0 and all(np.isnan(v) for v in rows[1][2:])
    assert "p50" in timeline.format_rows(rows)
    with pytest.raises(ValueError, match="entry"):
        timeline.summarise(_stamps(), ("a", "b", "c"))


def test_points_and_shape_match_the_kernel_sources():
    common = (ROOT / "kernels" / "common.cuh").read_text()
    consts = dict(re.findall(r"(kTimeline\w+) = (\d+)", common))
    assert int(consts["kTimelineCtas"]) == timeline.CTAS and int(consts["kTimelineWarps"]) == timeline.WARPS
    assert int(consts["kTimelinePoints"]) == len(timeline.POINTS)
    source = (ROOT / "kernels" / "score_wgmma.cu").read_text()
    # the single-query kernel's part (up to the pair kernel's segment) and the pair kernel's
    single, pairs = source.split("__device__ __forceinline__ void score_pair_segment(")
    used = sorted(int(i) for i in re.findall(r"TIMELINE_POINT\((\d+),", single))
    assert used == list(range(len(timeline.POINTS)))  # each point once, none missing
    used = sorted(int(i) for i in re.findall(r"TIMELINE_POINT\((\d+),", pairs))
    names = ("entry", "schedule built", "first tile landed", "last tile scored") + tuple(
        timeline.POINTS[p] for p in timeline.RESTART if timeline.POINTS[p] != "restart: ids issued")
    assert used == sorted(timeline.POINTS.index(name) for name in names)  # the ones the docstring names
    assert "TIMELINE_TILES(jbase)" in single and "TIMELINE_TILES(jbase)" in pairs
    for kernel in timeline.KERNELS:  # kernels of this source, by their names
        assert re.search(rf"\n{kernel.split('<')[0]}\(", source)


def test_the_timeline_build_only_adds_a_define():
    text = "// kernels\n__global__ void k() {}\n"
    built = timeline.timeline_source(text)
    assert built.endswith(text) and built.splitlines()[0] == "#define INDEXER_TIMELINE 1"


def test_sm_ends_take_each_sms_latest_cta():
    s = _stamps(ctas=6, points=3, warps=4)
    base = 10_000_000_000
    s[:, 0, 0] = base                                  # every CTA entered at once
    ends_ns = [100_000, 104_000, 101_000, 99_000, 150_000, 0]  # the last CTA never ended
    for cta, e in enumerate(ends_ns):
        if e:
            s[cta, 2, :] = base + e - 10 * np.arange(4)  # latest warp: warp 0
    smid = np.array([1, 1, 2, 2, 3, 4], np.uint32)     # SM ids + 1; SM 3's one CTA has no end
    n, p0, p50, p100, s50, s100 = timeline.sm_ends(s, smid, last=2)
    assert n == 3                                      # the SM whose CTA never ended is left out
    assert (p0, p50, p100) == (pytest.approx(101.0), pytest.approx(104.0), pytest.approx(150.0))
    assert (s50, s100) == (pytest.approx(2.0), pytest.approx(4.0))  # SM 0: 4 us apart, SM 1: 2, SM 2: 0
    assert "past the median SM" in timeline.format_sm_ends((n, p0, p50, p100, s50, s100))


def test_sm_ends_without_sm_ids_say_so():
    s = _stamps()
    s[:, 0, 0] = 5_000
    s[:, 2, 0] = 9_000
    assert timeline.sm_ends(s, np.zeros(6, np.uint32), last=2) is None
    assert "no CTA" in timeline.format_sm_ends(None)


def test_sm_ends_read_the_sm_id_below_the_slot():
    s = _stamps(ctas=2, points=3, warps=4)
    s[:, 0, 0] = 1_000
    s[0, 2, 0], s[1, 2, 0] = 5_000, 9_000
    smid = np.array([1 | (2 << 16), 1], np.uint32)     # both on SM 0, slots 2 and 0
    n, p0, p50, p100, s50, s100 = timeline.sm_ends(s, smid, last=2)
    assert n == 1 and p100 == pytest.approx(8.0) and s100 == pytest.approx(4.0)


def test_slot_rates_group_ctas_by_slot():
    s = _stamps(ctas=4, points=3, warps=4)
    s[:, 0, 0] = 1_000
    s[:, 1, 0] = 2_000                                 # first tile landed
    s[:, 2, 0] = [12_000, 22_000, 32_000, 0]           # the last CTA never ended
    smid = np.array([1, 2, 1 | (1 << 16), 2 | (1 << 16)], np.uint32)
    tiles = np.array([11, 21, 11, 5], np.uint32)
    rows = timeline.slot_rates(s, smid, tiles, first=1, last=2)
    assert [r[:2] for r in rows] == [(0, 2), (1, 1)]
    slot0, slot1 = rows
    assert slot0[2] == pytest.approx(16.0) and slot0[3] == pytest.approx(16.0)  # tiles, end p50
    assert slot0[4:] == (pytest.approx(1000.0), pytest.approx(1000.0), pytest.approx(1000.0))
    assert slot1[5] == pytest.approx(3000.0)           # (32 - 2) us over 10 tiles
    assert "ns a tile" in timeline.format_slot_rates(rows)


def test_restart_intervals_split_a_restart_and_skip_ctas_without_one():
    s = _stamps(ctas=3, points=len(timeline.POINTS), warps=4)
    s[:, 0, 0] = 1_000
    pts = list(timeline.RESTART)
    # CTA 0 restarts: tiles done at 10 us, flushed 10.4, entered 10.5, ids issued 10.6, tile 0
    # issued 11.0, query issued 11.2, query landed 11.9, first tile 12.5
    s[0, pts, 1] = [10_000, 10_400, 10_500, 10_600, 11_000, 11_200, 11_900, 12_500]
    s[1, pts, 2] = [20_000, 20_200, 20_300, 20_350, 20_500, 20_700, 21_200, 22_000]
    s[2, pts[:2], 0] = [5_000, 5_300]                  # its claim ended there: no next segment
    s[2, pts[2:], 0] = [200, 250, 300, 400, 500, 600]  # ... and its restart of an earlier replay
    n, rows = timeline.restart_intervals(s)
    assert n == 2 and [r[0] for r in rows] == ["flushed", "entered", "ids issued", "tile 0 issued",
                                               "query issued", "query landed", "first tile", "restart"]
    flushed, entered, ids, tile0, issued, landed, first, whole = rows
    assert flushed[1:] == (pytest.approx(0.2), pytest.approx(0.3), pytest.approx(0.4))
    assert ids[2] == pytest.approx(0.075) and tile0[2] == pytest.approx(0.275) and landed[3] == pytest.approx(0.7)
    assert whole[1] == pytest.approx(2.0) and whole[3] == pytest.approx(2.5)
    assert "restarts (2 CTAs)" in timeline.format_restarts((n, rows))
    assert timeline.restart_intervals(_stamps(ctas=3, points=len(timeline.POINTS))) is None
    assert "no CTA" in timeline.format_restarts(None)
    assert timeline.summarise(s)[pts[6]][1] == 2       # the earlier replay's stamp not passed


def test_restart_intervals_skip_the_points_a_kernel_does_not_stamp():
    s = _stamps(ctas=2, points=len(timeline.POINTS), warps=4)
    s[:, 0, 0] = 1_000
    pts = [p for p in timeline.RESTART if timeline.POINTS[p] != "restart: ids issued"]  # the pair kernel's
    s[0, pts, 0] = [10_000, 10_400, 10_500, 11_000, 11_200, 11_900, 12_500]
    n, rows = timeline.restart_intervals(s)
    assert n == 1 and [r[0] for r in rows] == ["flushed", "entered", "tile 0 issued", "query issued",
                                               "query landed", "first tile", "restart"]
    assert rows[2][2] == pytest.approx(0.5) and rows[-1][2] == pytest.approx(2.5)


def test_restart_ends_compare_the_ctas_with_a_restart_to_the_others():
    s = _stamps(ctas=12, points=len(timeline.POINTS), warps=4)
    s[:, 0, 0] = 1_000
    last, marker = timeline.POINTS.index("last tile scored"), timeline.POINTS.index("restart: tiles done")
    s[:, last, 0] = 1_000 + 1_000 * np.arange(1, 13)   # ends 1..12 us
    s[[10, 11], marker, 3] = 500_000                   # the two latest made a restart
    s[0, marker, 0] = 500                              # an earlier replay's: not this one's
    n_with, e_with, n_without, e_without, of_latest = timeline.restart_ends(s)
    assert (n_with, n_without, of_latest) == (2, 10, 2)
    assert e_with == pytest.approx(11.5) and e_without == pytest.approx(5.5)
    assert "2 of the latest ten" in timeline.format_restart_ends((n_with, e_with, n_without, e_without, of_latest))
    assert timeline.restart_ends(_stamps(ctas=2, points=len(timeline.POINTS))) is None


def test_select_points_match_the_streamed_select():
    source = (ROOT / "kernels" / "select_fast.cu").read_text()
    body = source.split("topk_row_stream_kernel(const float*")[1].split("\n}\n")[0]
    used = [int(i) for i in re.findall(r"TIMELINE_POINT\((\d+),", body)]
    assert used == list(range(len(timeline.SELECT_POINTS)))  # each once, in order
    assert "TIMELINE_TILES(cnt)" in body
    # the filter and rank kernels stamp theirs (the next test); no other kernel of the file does
    assert len(re.findall(r"TIMELINE_POINT\(", source)) == len(used) + len(timeline.FILTER_POINTS) + len(
        timeline.RANK_POINTS) + 1  # the rank kernel's "ranked" at each of its two ends


def test_filter_and_rank_points_match_their_kernels():
    source = (ROOT / "kernels" / "select_fast.cu").read_text()
    for kernel, points, ends in (("topk_filter_kernel(const float*", timeline.FILTER_POINTS, 1),
                                 ("topk_rank_kernel(const float*", timeline.RANK_POINTS, 2)):
        body = source.split(kernel)[1].split("\n}\n")[0]
        used = [int(i) for i in re.findall(r"TIMELINE_POINT\((\d+),", body)]
        # each point in order; the last at each of the kernel's ends (the rank's two routes)
        assert used == list(range(len(points))) + [len(points) - 1] * (ends - 1)
        assert "TIMELINE_POINT(0, true)" in body.split("wait_for_previous_grid")[0]  # the entry before the wait
    instances = [name for _, name in _jit.instances()]
    assert all(name in instances for name in timeline.FILTER_KERNELS + timeline.RANK_KERNELS)


def test_phases_take_each_step_over_the_ctas_that_passed_both_points():
    s = _stamps(ctas=4, points=16, warps=4)
    t0 = 1_000_000
    s[0, :3, 0] = t0 + np.array([0, 1_000, 4_000])
    s[1, :3, 3] = t0 + np.array([200, 1_600, 3_600])
    s[2, :2, 1] = t0 + np.array([100, 2_100])  # stopped at point 1 (an early return)
    s[3, :3, 0] = [5, 6, 7]                    # an earlier replay's
    rows = timeline.phases(s, ("a", "b", "c", "d"), t0)
    assert [(r[0], r[1]) for r in rows] == [("a -> b", 3), ("b -> c", 2), ("c -> d", 0)]
    assert rows[0][2:] == (pytest.approx(1.4), pytest.approx(2.0))
    assert rows[1][2:] == (pytest.approx(2.5), pytest.approx(3.0))
    assert all(np.isnan(v) for v in rows[2][2:])
    assert "a -> b 1.40 / 2.00 (3)" in timeline.format_phases(rows)


def test_select_phases_split_the_rows_and_rank_by_candidates():
    s = _stamps(ctas=4, points=len(timeline.POINTS), warps=4)
    t0 = 1_000_000
    # rows 0-2: entry, wait, threshold, streamed, ranked; row 3 from an earlier replay
    s[0, :5, 0] = t0 + np.array([100_000, 100_500, 103_500, 110_500, 114_500])
    s[1, :5, 2] = t0 + np.array([100_200, 100_600, 103_000, 111_000, 113_000])
    s[2, :5, 1] = t0 + np.array([100_100, 100_400, 103_400, 110_400, 116_400])
    s[3, :5, 0] = 500
    counts = np.array([1200, 900, 1500, 7], np.uint32)
    rows, (few, many) = timeline.select_phases(s, counts, t0)
    assert [r[0] for r in rows] == ["entry -> past the wait", "past the wait -> threshold found",
                                    "threshold found -> row streamed", "row streamed -> ranked"]
    assert rows[0][1:] == (pytest.approx(0.4), pytest.approx(0.5))
    assert rows[3][1:] == (pytest.approx(4.0), pytest.approx(6.0))
    assert few == pytest.approx(2.0) and many == pytest.approx(5.0)  # row 1 alone; rows 0 and 2
    assert "ranking p50" in timeline.format_select_phases((rows, (few, many)))
    assert timeline.select_phases(_stamps(ctas=2, points=len(timeline.POINTS)), counts[:2], t0) is None
    assert "another kernel" in timeline.format_select_phases(None)
    rows = timeline.summarise(s, timeline.SELECT_POINTS, t0=t0)
    assert rows[0][1] == 3 and rows[4][2] == pytest.approx(113.0) and rows[4][4] == pytest.approx(116.4)
