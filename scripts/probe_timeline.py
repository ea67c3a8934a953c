#!/usr/bin/env python3
"""Where the balanced wgmma scoring kernels' CTAs spend their time, point by point, on the GPU.

    python scripts/probe_timeline.py                          # decode-128K and decode-1M
    python scripts/probe_timeline.py --cases decode-E256,mtp-2 --replays 8 --save tl.npz

kernels/score_wgmma.cu marks sixteen points of score_wgmma_kernel with TIMELINE_POINT
(kernels/common.cuh): the CTA's entry, its schedule built, and in its first segment the
first tile's copies issued, the wait for the staging kernel passed, the query's copies and
the other first tiles issued, the query landed (the barrier after it), the first tile's keys
landed; then its last tile scored; and the eight of a segment restart (a claim running on
into the next row): the segment's tiles done, its histogram flushed, the next segment
entered, its block ids' loads issued, its tile 0 issued, its query's copies issued, its
query landed and its first tile's keys landed. The pair kernel (mtp-2) marks the entry,
the schedule built, the first tile's keys landed, the last tile scored and six restart
points (a piece after the CTA's first: the piece before it done and flushed, the piece
entered, its first tiles issued, both queries stored, the barrier after them, its first
tile's keys landed). In the usual
build the points are nothing; this script compiles the kernels once more with
INDEXER_TIMELINE defined, where lane 0 of each warp stores %globaltimer at each point it
passes (plain stores: a probe by atomics added ~2 us to the points it measured,
docs/performance.md v72), runs the case's scoring alone as `scripts/bench.py` times it
(CUDA-graph replays: the staging kernel and the scoring kernel overlap as in an engine's
graph), and prints, for each point, when the CTAs' latest warp passed it: p0 / p50 / p100
over the CTAs, in microseconds from the first CTA's entry, from the last replay; then the
SMs' last ends (each CTA's SM id is stamped at its entry): the kernel ends with its slowest
SM; then, per warp slot on the SM (ShareClaims' first claims are sized by it), the CTAs'
tiles, ends and time a tile (thread 0 stamps the tiles it scored); then how the CTAs'
restarts split and whether the CTAs that made one end later. --whole times the whole call
(scoring and select) and stamps the streamed select too (mtp-2's and decode-128K's, one CTA a
row: its entry, the wait passed, the threshold found, the row streamed, the candidates
ranked), from the scoring's first entry, with its phases and the ranking's time by the
rows' candidate counts; where a run's select is the filter and rank kernels instead
(decode-1M's, decode-E256's and decode-ragged's runs), theirs: the filter's CTAs (a
4,096-entry chunk each) at their entry, the wait passed, the threshold found, their
candidates counted into the row's, appended; the rank kernel's at their entry, the wait
passed, the candidates loaded, ranked; each with its phases. --save keeps the raw arrays.
A case of several runs of rows (decode-1M: two of 32 rows) shows its last run.
Cases whose scoring is neither kernel (decode-latency, prefill) stamp nothing; the stamps
are indexed by the CTA's place in its grid (blockIdx.x + gridDim.x * blockIdx.y, the first
4,096).
The timeline build's tile loop carries ~10 instructions more (the first-tile point's test)
and its prologue spills more: its times, not its start's points, read long, and two
versions' timeline builds differ in their loops too (docs/performance.md v73), so compare
versions by their points here and by scripts/ab_kernels.py for their times.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer import _jit, bench, geometry  # noqa: E402

SOURCE = "score_wgmma.cu"
#: the kernels stamped (the benchmark cases' D): the single-query kernel at every point, the
#: pair kernel (mtp-2) at points 0, 1 and 6-14 (all but "restart: ids issued")
KERNELS = ("score_wgmma_kernel<128>", "score_wgmma_pairs_kernel<128>")
#: TIMELINE_POINT indices in kernels/score_wgmma.cu, in order
POINTS = ("entry", "schedule built", "tile 0 issued", "past the wait", "query, tiles 1-2 issued",
          "query landed", "first tile landed", "last tile scored",
          "restart: tiles done", "restart: flushed", "restart: query landed", "restart: first tile",
          "restart: tile 0 issued", "restart: query issued", "restart: entered", "restart: ids issued")
#: the points of a segment restart (a claim running on into the next row), in the order a
#: CTA passes them: the segment's tiles done, its histogram flushed, the next segment
#: entered, its block ids' loads issued, its tile 0 issued, its query's (and tiles 1-2's)
#: copies issued, its query landed, its first tile. The pair kernel passes six of them
#: (not "ids issued"; its "tile 0 issued" is all its first tiles issued, its "query issued"
#: both queries stored).
RESTART = tuple(POINTS.index(f"restart: {p}") for p in ("tiles done", "flushed", "entered", "ids issued",
                                                         "tile 0 issued", "query issued", "query landed",
                                                         "first tile"))
#: kernels/common.cuh: kTimelineCtas, kTimelinePoints, kTimelineWarps
CTAS, WARPS = 4096, 4
#: --whole: the streamed select (kernels/select_fast.cu, one CTA a row after the scoring in
#: mtp-2 and decode-128K) and its TIMELINE_POINTs, in order; its TIMELINE_TILES stamps
#: each row's candidate count
SELECT_SOURCE = "select_fast.cu"
SELECT_POINTS = ("entry", "past the wait", "threshold found", "row streamed", "ranked")
#: --whole: the filter and rank kernels (kernels/select_fast.cu; runs that neither stream
#: nor sample), their TIMELINE_POINTs in order, and the instances a call may take
FILTER_POINTS = ("entry", "past the wait", "threshold found", "counted", "appended")
RANK_POINTS = ("entry", "past the wait", "candidates loaded", "ranked")
FILTER_KERNELS = ("topk_filter_kernel<256, 16>", "topk_filter_kernel<256, 4>")
RANK_KERNELS = ("topk_rank_kernel<256, false>", "topk_rank_kernel<256, true>")


def timeline_source(text: str) -> str:
    """A kernel source (as `_jit.read_source` gives it) built with its timeline points."""
    return "#define INDEXER_TIMELINE 1\n" + text


def first_entry(s):
    """The earliest CTA entry (point 0) of int64 stamps [ctas, points, warps], the time every
    figure counts from; None where no CTA stamped its entry."""
    entries = s[:, 0, :]
    return int(entries[entries > 0].min()) if (entries > 0).any() else None


def summarise(stamps, points=POINTS, t0=None):
    """Per point, when the CTAs' latest warp passed it.

    stamps: uint64 [ctas, points, warps] of %globaltimer nanoseconds, 0 where a warp did not
    pass the point. Returns rows (name, CTAs that passed it, p0, p50, p100), the times in
    microseconds from t0, by default the earliest entry (point 0); NaN times where no CTA
    passed it. A stamp from before t0 (an earlier replay's, at a point only some CTAs pass)
    does not count."""
    s = np.asarray(stamps).astype(np.int64)
    t0 = first_entry(s) if t0 is None else int(t0)
    if t0 is None:
        raise ValueError("no CTA stamped its entry: the case's scoring is not the timeline build's kernel")
    rows = []
    for i, name in enumerate(points):
        per_cta = np.where(s[:, i, :] >= t0, s[:, i, :], 0)  # stamps of an earlier replay: not passed
        passed = (per_cta > 0).any(axis=1)
        if not passed.any():
            rows.append((name, 0, float("nan"), float("nan"), float("nan")))
            continue
        latest = (per_cta[passed].max(axis=1) - t0) / 1e3  # int64 until here: %globaltimer has 61 bits
        rows.append((name, int(passed.sum()), float(latest.min()), float(np.median(latest)), float(latest.max())))
    return rows


def select_phases(select_stamps, counts, t0):
    """The streamed select's phases, for --whole: per consecutive pair of SELECT_POINTS, the
    interval p50 / p100 in microseconds over the rows' CTAs that passed both in this replay,
    and the ranking's p50 for rows of at most and of more candidates than the CTA's 1,024
    threads. select_stamps: [ctas, points, warps] as `summarise` takes them; counts: each
    row's candidates (its CTA's TIMELINE_TILES); t0: the scoring's earliest entry. Returns
    (rows (name, p50, p100), (rank p50 at <= 1,024, rank p50 above)), or None where no CTA
    ranked."""
    s = np.asarray(select_stamps).astype(np.int64)
    at = s[:, : len(SELECT_POINTS), :].max(axis=2)
    ok = (at >= t0).all(axis=1)
    if not ok.any():
        return None
    rows = [(name, p50, p100) for name, _, p50, p100 in phases(s[ok], SELECT_POINTS, t0)]
    at, cnt = at[ok], np.asarray(counts).astype(np.int64)[: s.shape[0]][ok]
    rank = (at[:, -1] - at[:, -2]) / 1e3
    few, many = rank[cnt <= 1024], rank[cnt > 1024]
    return rows, (float(np.median(few)) if len(few) else float("nan"),
                  float(np.median(many)) if len(many) else float("nan"))


def phases(stamps, points, t0):
    """Each step between consecutive points of a kernel's CTAs: per pair, the CTAs whose
    latest warp passed both in this replay (stamps >= t0), and the step's p50 / p100 in
    microseconds over them. stamps: [ctas, points, warps] as `summarise` takes them.
    Returns rows (name, CTAs, p50, p100); NaN where no CTA passed both."""
    s = np.asarray(stamps).astype(np.int64)
    at = s[:, : len(points), :].max(axis=2)
    rows = []
    for i in range(1, len(points)):
        ok = (at[:, i - 1] >= t0) & (at[:, i] >= t0)
        d = (at[ok, i] - at[ok, i - 1]) / 1e3
        rows.append((f"{points[i - 1]} -> {points[i]}", int(ok.sum()),
                     float(np.median(d)) if ok.any() else float("nan"), float(d.max()) if ok.any() else float("nan")))
    return rows


def format_phases(rows) -> str:
    return "  phases, us p50 / p100 (CTAs): " + ", ".join(f"{n} {a:.2f} / {b:.2f} ({c})" for n, c, a, b in rows)


def format_select_phases(found) -> str:
    if found is None:
        return "  the select: no streamed-select CTA ranked in this replay (its select is another kernel)"
    rows, (few, many) = found
    return ("  the select's phases, us p50 / p100: " + ", ".join(f"{n} {a:.2f} / {b:.2f}" for n, a, b in rows)
            + f"; ranking p50 at <= 1,024 candidates {few:.2f}, above {many:.2f}")


def restart_intervals(stamps, points=RESTART):
    """How a segment restart's time splits, in the CTAs that made one: the intervals between
    the restart's consecutive points (of `points`, those some CTA of the last replay passed:
    the pair kernel stamps fewer) and in all, each p0 / p50 / p100 in microseconds over those
    CTAs, each interval named by the point it ends at. A CTA stamps the end of every segment
    its claim runs on past and the start of every segment after its first, so a CTA of
    several restarts shows its last; stamps left from an earlier replay are not counted.
    Returns (CTAs, rows (name, p0, p50, p100)), or None where no CTA made one."""
    s = np.asarray(stamps).astype(np.int64)
    t0 = first_entry(s)
    if t0 is None:
        return None
    at = s[:, list(points), :].max(axis=2)  # each CTA's latest warp at each point
    stamped = (at >= t0).any(axis=0)
    if stamped.sum() < 2:
        return None
    points = [p for p, k in zip(points, stamped) if k]
    at = at[:, stamped]
    # every point from the last replay: a CTA whose claim (made in arrival order) held a restart
    # in an earlier replay only keeps that replay's stamps, from before the last one's entries
    ok = (at >= t0).all(axis=1)
    if not ok.any():
        return None
    at = at[ok]
    names = [POINTS[p].removeprefix("restart: ") for p in points[1:]] + ["restart"]
    spans = [at[:, i + 1] - at[:, i] for i in range(len(points) - 1)] + [at[:, -1] - at[:, 0]]
    return int(ok.sum()), [(n, float(x.min()) / 1e3, float(np.median(x)) / 1e3, float(x.max()) / 1e3)
                           for n, x in zip(names, spans)]


def restart_ends(stamps, last=POINTS.index("last tile scored"), marker=POINTS.index("restart: tiles done"),
                 latest=10):
    """Whether the CTAs that made a restart end later: the CTAs' ends (point `last`), p50 in
    microseconds from the earliest entry, of those with a restart (point `marker` passed in
    the last replay) and of those without, and how many of the `latest` latest CTAs made one.
    Returns (CTAs with, their end p50, CTAs without, their end p50, of the latest), or None
    where no CTA ended."""
    s = np.asarray(stamps).astype(np.int64)
    t0 = first_entry(s)
    if t0 is None:
        return None
    ends = s[:, last, :].max(axis=1)
    ok = ends >= t0
    if not ok.any():
        return None
    made = (s[:, marker, :].max(axis=1) >= t0)[ok]
    ends = (ends[ok] - t0) / 1e3
    p50 = lambda x: float(np.median(x)) if len(x) else float("nan")  # noqa: E731
    order = np.argsort(ends)[::-1][:latest]
    return int(made.sum()), p50(ends[made]), int((~made).sum()), p50(ends[~made]), int(made[order].sum())


def format_restart_ends(found) -> str:
    if found is None:
        return "  restart ends: no CTA ended"
    n_with, e_with, n_without, e_without, of_latest = found
    return (f"  CTAs with a restart end p50 {e_with:.2f} us ({n_with} CTAs), without {e_without:.2f} "
            f"({n_without}); {of_latest} of the latest ten made one")


def format_restarts(found) -> str:
    if found is None:
        return "  restarts: no CTA ran on into a next segment"
    n, rows = found
    return f"  restarts ({n} CTAs), us p0 / p50 / p100: " + ", ".join(
        f"{name} {p0:.2f} / {p50:.2f} / {p100:.2f}" for name, p0, p50, p100 in rows)


def sm_ends(stamps, smid, last=POINTS.index("last tile scored")):
    """When each SM's CTAs finished: the kernel ends with its slowest SM.

    stamps: as `summarise` takes them; smid: uint32 [ctas], SM id + 1 in bits 0-15 (0: the
    CTA did not stamp), its warp slot in bits 16-23. A CTA's end is when its latest warp
    passed point `last`. Returns (SMs, the SMs' last ends p0 / p50 / p100, the spread of ends
    within an SM p50 / p100), in microseconds from the earliest entry; None where no CTA with
    an SM id passed `last`."""
    s = np.asarray(stamps).astype(np.int64)
    sm = np.asarray(smid).astype(np.int64)[: s.shape[0]] & 0xFFFF
    t0 = first_entry(s)
    ends = s[:, last, :].max(axis=1)
    ok = (sm > 0) & (ends > 0)
    if t0 is None:
        return None
    if not ok.any():
        return None
    per_sm = {}
    for sm_id, end in zip(sm[ok], (ends[ok] - t0) / 1e3):
        per_sm.setdefault(int(sm_id), []).append(float(end))
    last_end = np.array([max(v) for v in per_sm.values()])
    spread = np.array([max(v) - min(v) for v in per_sm.values()])
    return (len(per_sm), float(last_end.min()), float(np.median(last_end)), float(last_end.max()),
            float(np.median(spread)), float(spread.max()))


def slot_rates(stamps, smid, tiles, first=POINTS.index("first tile landed"), last=POINTS.index("last tile scored")):
    """Per warp slot on the SM (ShareClaims sizes a CTA's first claim by it): how many tiles
    its CTAs scored, when they ended and how long a tile took them.

    stamps, smid: as `sm_ends` takes them; tiles: uint32 [ctas], the tiles each CTA scored.
    A CTA's tile time is (its end - its first tile's landing) / (tiles - 1). Returns rows
    (slot, CTAs, tiles p50, end p50, ns a tile p0 / p50 / p100), ends in microseconds from the
    earliest entry; CTAs with fewer than two tiles or without both points are left out."""
    s = np.asarray(stamps).astype(np.int64)
    n = s.shape[0]
    info = np.asarray(smid).astype(np.int64)[:n]
    tl = np.asarray(tiles).astype(np.int64)[:n]
    t0 = first_entry(s)
    if t0 is None:
        return []
    begin = s[:, first, :].max(axis=1)
    end = s[:, last, :].max(axis=1)
    ok = ((info & 0xFFFF) > 0) & (begin > 0) & (end > 0) & (tl > 1)
    slot = info >> 16
    rows = []
    for k in np.unique(slot[ok]):
        m = ok & (slot == k)
        per_tile = (end[m] - begin[m]) / (tl[m] - 1)
        rows.append((int(k), int(m.sum()), float(np.median(tl[m])), float(np.median((end[m] - t0) / 1e3)),
                     float(per_tile.min()), float(np.median(per_tile)), float(per_tile.max())))
    return rows


def format_slot_rates(rows) -> str:
    lines = [f"  {'slot':>6s} {'CTAs':>5s} {'tiles':>7s} {'end us':>8s}   ns a tile p0 / p50 / p100"]
    lines += [f"  {k:6d} {n:5d} {t:7.1f} {e:8.2f}   {a:7.0f} {b:7.0f} {c:7.0f}" for k, n, t, e, a, b, c in rows]
    return "\n".join(lines)


def format_sm_ends(ends) -> str:
    if ends is None:
        return "  SMs: no CTA stamped both its SM and its end"
    n, p0, p50, p100, s50, s100 = ends
    return (f"  SMs' last ends ({n} SMs)   {p0:8.2f} {p50:8.2f} {p100:8.2f}  us; the kernel ends "
            f"{p100 - p50:.2f} us past the median SM's end; an SM's CTAs end {s50:.2f} us apart (p50), "
            f"{s100:.2f} at most")


def format_rows(rows) -> str:
    lines = [f"  {'point':26s} {'CTAs':>5s} {'p0':>8s} {'p50':>8s} {'p100':>8s}  us"]
    lines += [f"  {name:26s} {n:5d} {p0:8.2f} {p50:8.2f} {p100:8.2f}" for name, n, p0, p50, p100 in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="decode-128K,decode-1M", help="benchmark cases (scripts/bench.py --cases)")
    ap.add_argument("--replays", type=int, default=4, help="graph replays before the one whose stamps are read")
    ap.add_argument("--save", default=None, help="write each case's stamps, SM ids and tiles to this .npz")
    ap.add_argument("--whole", action="store_true",
                    help="time the whole call (scoring and select), the streamed select stamped too")
    args = ap.parse_args(argv)
    try:
        cases = bench.select_cases(args.cases)
    except ValueError as e:
        ap.error(str(e))
    try:
        cp = bench.require_gpu()
    except bench.GPUUnavailable as exc:
        print(exc)
        return 2
    from indexer import Workspace, cuda_ops  # noqa: PLC0415  (GPU only)

    tag, select_tag = f"{SOURCE}@timeline", f"{SELECT_SOURCE}@timeline"
    saved, saved_select = dict(cuda_ops._SCORING_SOURCES), cuda_ops._SELECT_SOURCE
    dev = cp.cuda.Device()
    with _jit.source_versions({tag: timeline_source(_jit.read_source(SOURCE))}, like=SOURCE), \
            _jit.source_versions({select_tag: timeline_source(_jit.read_source(SELECT_SOURCE))}, like=SELECT_SOURCE):
        try:
            cuda_ops._SCORING_SOURCES["wgmma"] = cuda_ops._SCORING_SOURCES["pairs"] = tag
            if args.whole:
                cuda_ops._SELECT_SOURCE = select_tag
            cuda_ops.clear_plans()

            def stamped(source_tag, kernel):  # a kernel's module's (stamps, SM ids, tiles)
                module = _jit._module(source_tag, kernel, dev.id, int(dev.compute_capability))
                return (cp.ndarray((CTAS, len(POINTS), WARPS), cp.uint64, module.get_global("timeline_stamps")),
                        cp.ndarray((CTAS,), cp.uint32, module.get_global("timeline_smid")),
                        cp.ndarray((CTAS,), cp.uint32, module.get_global("timeline_tiles")))
            globals_of = [stamped(tag, kernel) for kernel in KERNELS]
            select_globals = (stamped(select_tag, f"topk_row_stream_kernel<{geometry.ROW_STREAM_THREADS}>")
                              if args.whole else ())
            # the filter and rank kernels' instances (compiled here if the calls take none)
            filter_globals = [stamped(select_tag, k) for k in FILTER_KERNELS] if args.whole else []
            rank_globals = [stamped(select_tag, k) for k in RANK_KERNELS] if args.whole else []
            saved_arrays = {}
            for case in cases:
                sets, _ = bench.input_sets(case, cp, 0)
                ws = Workspace()

                def call(x, case=case, ws=ws):
                    return bench.call_case(cuda_ops, x, case.top_k, validate=False, workspace=ws,
                                           _score_only=not args.whole)

                bench.time_graph(cp, call, sets[:1], repeats=args.replays)  # compiled, warm
                for arrays in globals_of + [select_globals] + filter_globals + rank_globals:
                    for a in arrays:
                        a.fill(0)
                ms = bench.time_graph(cp, call, sets[:1], repeats=args.replays)  # its last replay stamps last
                dev.synchronize()
                # the kernel that ran: the one whose CTAs stamped their entries
                stamps, smid, tiles = max(globals_of, key=lambda a: int((a[0][:, 0, :] > 0).sum()))
                print(f"{case.name}: {'the whole call' if args.whole else 'scoring alone'} {ms:.4f} ms "
                      "(graph, timeline build)")
                stamps, smid, tiles = stamps.get(), smid.get(), tiles.get()  # one copy each to the host
                try:
                    print(format_rows(summarise(stamps)))
                    print(format_sm_ends(sm_ends(stamps, smid)))
                    print(format_slot_rates(slot_rates(stamps, smid, tiles)))
                    print(format_restarts(restart_intervals(stamps)))
                    print(format_restart_ends(restart_ends(stamps)))
                    if args.whole:
                        select_stamps, counts = select_globals[0].get(), select_globals[2].get()
                        t0 = first_entry(np.asarray(stamps).astype(np.int64))
                        print("  the streamed select, from the scoring's first entry:")
                        print(format_rows(summarise(select_stamps, SELECT_POINTS, t0=t0)))
                        print(format_select_phases(select_phases(select_stamps, counts, t0)))
                        saved_arrays.update({f"{case.name}/select_stamps": select_stamps,
                                             f"{case.name}/select_counts": counts})
                        for label, kernels, points in (("filter", filter_globals, FILTER_POINTS),
                                                       ("rank", rank_globals, RANK_POINTS)):
                            # the instance that ran: the one whose CTAs stamped their entries
                            arrays = max(kernels, key=lambda a: int((a[0][:, 0, :] > 0).sum()))[0].get()
                            if not (arrays[:, 0, :] >= t0).any():
                                continue
                            print(f"  the {label} kernel, from the scoring's first entry:")
                            print(format_rows(summarise(arrays, points, t0=t0)))
                            print(format_phases(phases(arrays, points, t0)))
                            saved_arrays[f"{case.name}/{label}_stamps"] = arrays
                except ValueError as e:
                    print(f"  {e}")
                saved_arrays.update({f"{case.name}/stamps": stamps, f"{case.name}/smid": smid,
                                     f"{case.name}/tiles": tiles})
            if args.save:
                np.savez_compressed(args.save, **saved_arrays)
        finally:
            cuda_ops._SCORING_SOURCES.clear()
            cuda_ops._SCORING_SOURCES.update(saved)
            cuda_ops._SELECT_SOURCE = saved_select
            cuda_ops.clear_plans()
    return 0


if __name__ == "__main__":
    sys.exit(main())
