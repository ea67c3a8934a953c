"""indexer.plot and 'indexer plot', rendered headless (matplotlib's Agg) to PNG files in tmp_path."""

import json
import subprocess
import sys

import numpy as np
import pytest
from cli_runner import separate_runner

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")  # headless: no display in tests

import matplotlib.pyplot as plt  # noqa: E402

from indexer import arrays, causal_lens, cli, io, plot, reference, score_topk_ragged, testing  # noqa: E402
from indexer.pool import KeyPool  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MISSING = "indexer.plot needs matplotlib: pip install matplotlib"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def assert_png(path, min_bytes=5000):
    """A real PNG image of non-trivial size."""
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, data[:8]
    assert len(data) > min_bytes, len(data)


def save(fig, path):
    fig.savefig(path)
    assert_png(path)


def bench_results():
    """The layout of indexer.bench.run's results: three cases, paths missing from some."""
    def numbers(x):
        return {"ms": 0.3 * x, "x_floor": x, "tflops": 100.0, "gbs": 2000.0, "extra_mb": 0.0, "vs_torch": None}

    return {
        "device": "NVIDIA H200", "date": "2026-11-30", "copy_bw": 4.12e12, "tensor_rate": 7.54e14,
        "cases": [
            {"case": "decode-1M", "floor_ms": 0.36, "paths": {
                "fast": numbers(3.4), "fast (graph)": numbers(3.06), "exact": numbers(34.0),
                "torch-composed": numbers(155.0)}},
            {"case": "decode-128K", "floor_ms": 0.09, "paths": {
                "fast": numbers(4.1), "fast (graph)": numbers(3.4), "torch-composed": numbers(186.0)}},
            {"case": "mtp-2", "floor_ms": 0.18, "paths": {"fast": numbers(3.5), "exact": numbers(34.0)}},
        ],
    }


# ----------------------------------------------------------------------------- the module


def test_import_does_not_import_matplotlib():
    code = "import sys, indexer, indexer.plot, indexer.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture
def no_matplotlib(monkeypatch):
    """Make 'import matplotlib' fail, as where it is not installed."""
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.setitem(sys.modules, name, None)


def test_missing_matplotlib_is_an_import_error_saying_how_to_install(no_matplotlib):
    calls = [
        lambda: plot.selection_map(np.zeros((2, 3), dtype=np.int32)),
        lambda: plot.score_distribution(np.arange(5.0), top_k=2),
        lambda: plot.benchmark_bars(bench_results()),
        plot.require_matplotlib,
    ]
    for call in calls:
        with pytest.raises(ImportError) as info:
            call()
        assert str(info.value) == MISSING


# ----------------------------------------------------------------------------- selection_map


def test_selection_map_scatters_the_selected_pairs(tmp_path):
    indices = np.array([[4, 1, -1, -1], [0, 2, 5, 3], [-1, -1, -1, -1]], dtype=np.int32)
    lens = np.array([5, 6, 0], dtype=np.int32)
    fig = plot.selection_map(indices, lens, title="three queries")
    ax = fig.axes[0]
    (dots,) = ax.collections
    got = {(int(x), int(y)) for x, y in dots.get_offsets()}
    assert got == {(4, 0), (1, 0), (0, 1), (2, 1), (5, 1), (3, 1)}  # (entry, query), no padding
    assert len(dots.get_offsets()) == 6
    (step,) = ax.get_lines()
    assert np.array_equal(step.get_xdata(), np.repeat(lens - 0.5, 2))  # the visibility boundary per row
    assert ax.get_title() == "three queries"
    assert ax.get_ylim() == (2.5, -0.5)  # query 0 at the top
    assert ax.get_xlim() == (-0.5, 5.5)
    save(fig, tmp_path / "selection.png")


def test_selection_map_of_a_prefill(tmp_path, rng):
    """A causal prefill through score_topk_ragged: every selection left of its row's boundary."""
    pool = KeyPool(4, entries_per_block=16, head_dim=32)
    pool.append(0, rng.standard_normal((32, 32), dtype=np.float32))
    cu = np.array([0, 128], dtype=np.int32)
    lens = causal_lens(cu, ratio=4)
    q = rng.standard_normal((128, 4, 32), dtype=np.float32)
    w = rng.standard_normal((128, 4), dtype=np.float32)
    idx = score_topk_ragged(q, w, pool.keys_fp4, pool.key_scale, pool.key_gscale, pool.block_table([0]), cu,
                            lens, 8, backend="numpy")
    fig = plot.selection_map(idx, lens)
    offsets = fig.axes[0].collections[0].get_offsets()
    assert len(offsets) == int((idx >= 0).sum()) == int(np.minimum(lens, 8).sum())
    assert np.all(offsets[:, 0] < lens[offsets[:, 1].astype(int)])
    assert "top-8 selection of 128 queries" in fig.axes[0].get_title()
    save(fig, tmp_path / "prefill.png")


def test_selection_map_into_given_axes_without_lens(tmp_path):
    fig, (left, right) = plt.subplots(1, 2)
    got = plot.selection_map([[2, 0], [1, -1]], ax=right)  # a list works too (any array-like)
    assert got is fig
    assert not left.collections and len(right.collections[0].get_offsets()) == 3
    assert not right.get_lines() and right.get_legend() is None
    save(fig, tmp_path / "two.png")


def test_selection_map_raster_for_many_selections(tmp_path, rng, monkeypatch):
    T, k, n = 300, 40, 500
    idx = np.stack([rng.permutation(n)[:k] for _ in range(T)]).astype(np.int32)
    idx[:, -5:] = -1
    fig = plot.selection_map(idx, np.full(T, n), raster=True)
    ax = fig.axes[0]
    assert not ax.collections
    (image,) = ax.get_images()
    assert image.get_array().sum() == T * (k - 5)  # every selection counted once
    save(fig, tmp_path / "raster.png")
    monkeypatch.setattr(plot, "RASTER_ABOVE", 100)  # auto: a raster above RASTER_ABOVE selections
    assert plot.selection_map(idx).axes[0].get_images()
    monkeypatch.setattr(plot, "RASTER_ABOVE", 10**9)
    assert not plot.selection_map(idx).axes[0].get_images()


@pytest.mark.parametrize("indices, lens, message", [
    (np.zeros(4, dtype=np.int32), None, "indices: expected a 2-D integer array"),
    (np.zeros((2, 3), dtype=np.float32), None, "indices: expected a 2-D integer array"),
    (np.zeros((0, 3), dtype=np.int32), None, "T >= 1, got int32 (0, 3)"),
    (np.zeros((2, 3), dtype=np.int32), np.zeros(3, dtype=np.int32),
     "valid_lens: expected an integer array of shape (2,)"),
    (np.zeros((2, 3), dtype=np.int32), np.zeros(2), "valid_lens"),
])
def test_selection_map_errors(indices, lens, message):
    with pytest.raises(ValueError) as info:
        plot.selection_map(indices, lens)
    assert message in str(info.value)


@pytest.mark.parametrize("raster", ["no", 1, np.zeros(2)])
def test_selection_map_refuses_a_raster_that_is_no_bool(raster):
    with pytest.raises(TypeError, match="^raster: expected True, False or None"):
        plot.selection_map(np.zeros((2, 3), dtype=np.int32), raster=raster)


def test_score_distribution_takes_edges_and_rules():
    row = np.arange(100.0)
    ax = plot.score_distribution(row, bins=[0.0, 50.0, 99.0]).axes[0]
    assert [p.get_height() for p in ax.patches] == [50, 50]
    ax = plot.score_distribution(row, bins="sturges").axes[0]
    assert len(ax.patches) == len(np.histogram_bin_edges(row, bins="sturges")) - 1


# ----------------------------------------------------------------------------- score_distribution


def threshold_line(ax):
    (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("k-th score")]
    x0, x1 = line.get_xdata()
    assert x0 == x1
    return float(x0), line.get_label()


def test_score_distribution_marks_the_kth_score(tmp_path, rng):
    row = rng.standard_normal(2000) * 10
    row[[3, 70, 900]] = np.nan   # never selectable
    row[[5, 6]] = -np.inf        # padding
    top_k = 64
    fig = plot.score_distribution(row, top_k=top_k, bins=50)
    ax = fig.axes[0]
    expected = np.sort(row[~np.isnan(row) & np.isfinite(row)])[::-1][top_k - 1]
    x, label = threshold_line(ax)
    assert x == expected
    assert "k = 64" in label
    assert sum(p.get_height() for p in ax.patches) == 2000 - 5  # NaN and -inf left out
    assert len(ax.patches) == 50
    assert ax.get_yscale() == "log"  # 2000 entries: log counts keep the tail visible
    save(fig, tmp_path / "scores.png")


def test_score_distribution_with_the_selected_scores(tmp_path, rng):
    """The threshold from score_topk's own scores, the selection drawn on the same bins."""
    p = testing.random_problem(rng, T=2, H=4, D=32, E=8, lens=[100, 40], top_k=16)
    _, scores = reference.score_topk(*p.args(), return_scores=True)
    row = reference.row_scores(p.q[0], p.w[0], p.keys_fp4, p.key_scale, p.key_gscale, p.block_table[0], 100)
    fig = plot.score_distribution(row, selected_scores=scores[0], bins=20, title="query 0")
    ax = fig.axes[0]
    x, label = threshold_line(ax)  # top_k from the number of finite selected scores
    assert x == np.sort(row)[::-1][15] and "k = 16" in label
    assert len(ax.patches) == 40  # two histograms on the same 20 bins
    assert sum(p.get_height() for p in ax.patches[20:]) == 16
    assert ax.get_title() == "query 0"
    assert ax.get_yscale() == "linear"  # few entries per bin
    save(fig, tmp_path / "selected.png")


def test_axes_that_are_not_axes_are_refused_by_name():
    with pytest.raises(TypeError, match="^ax: expected a matplotlib Axes or None, got str"):
        plot.score_distribution(np.arange(5.0), ax="x")


def test_score_distribution_draws_every_selected_score_past_the_rows_maximum():
    """A selected score returned in float32 can round past the row's float64 maximum: the
    bins span both, so every selected score is drawn (the legend counts them all)."""
    row = np.array([1.0, 2.0, 3.0, 158.0828651])
    selected = np.array([158.08287, 3.0], dtype=np.float32)  # 158.0828651 rounded up
    fig = plot.score_distribution(row, selected_scores=selected, bins=10)
    ax = fig.axes[0]
    assert sum(p.get_height() for p in ax.patches[10:]) == 2


def test_score_distribution_padding_and_edges():
    # fewer finite scores than top_k: the line sits at the lowest one
    sel = np.array([3.0, 1.0, -np.inf, -np.inf], dtype=np.float32)
    fig = plot.score_distribution(np.array([1.0, np.nan, 3.0, -np.inf]), sel, top_k=4)
    assert threshold_line(fig.axes[0]) == (1.0, "k-th score (k = 2): 1")
    # no top_k and no selection: no line; log forced
    ax = plot.score_distribution(np.arange(10.0), log=True).axes[0]
    assert not ax.get_lines() and ax.get_yscale() == "log"
    # nothing finite at all: an empty plot, no error
    ax = plot.score_distribution(np.full(5, np.nan), top_k=3).axes[0]
    assert not ax.get_lines() and not ax.patches


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(scores_row=np.zeros((2, 3))), ValueError, "scores_row: expected a 1-D array"),
    (dict(scores_row=np.array(["a", "b"])), ValueError, "scores_row: expected a 1-D array"),
    (dict(scores_row=np.zeros(3), selected_scores=np.zeros((1, 2))), ValueError, "selected_scores"),
    (dict(scores_row=np.zeros(3), top_k=0), ValueError, "top_k: expected a positive int"),
    (dict(scores_row=np.zeros(3), top_k=True), TypeError, "top_k"),
    (dict(scores_row=np.zeros(3), top_k=2.0), TypeError, "top_k"),
    (dict(scores_row=np.zeros(3), log="no"), TypeError, "log: expected True, False or None"),
    (dict(scores_row=np.zeros(3), bins=10**8), ValueError, "bins: expected 1 to"),
    (dict(scores_row=np.zeros(3), bins=0), ValueError, "bins: expected 1 to"),
    (dict(scores_row=np.zeros(3), bins="many"), ValueError, "bins: expected an int, edges or one of"),
    (dict(scores_row=np.zeros(3), bins=[[0, 1]]), TypeError, "bins: expected an int"),
    (dict(scores_row=np.zeros(3), bins=True), TypeError, "bins: expected an int"),
    # finite scores whose range NumPy cannot cut into bins: named, not NumPy's own error
    (dict(scores_row=np.array([-1e308, 1e308])), ValueError, "scores_row: its scores' range"),
    (dict(scores_row=np.array([1.0, np.nextafter(1.0, 2.0)])), ValueError, "scores_row: its scores' range"),
])
def test_score_distribution_errors(kwargs, error, message):
    with pytest.raises(error) as info:
        plot.score_distribution(**kwargs)
    assert message in str(info.value)


# ----------------------------------------------------------------------------- benchmark_bars


def test_benchmark_bars_one_bar_per_case_and_path(tmp_path):
    results = bench_results()
    fig = plot.benchmark_bars(results)
    ax = fig.axes[0]
    containers = ax.containers
    assert [c.get_label() for c in containers] == ["fast", "fast (graph)", "exact", "torch-composed"]
    bars = {(c.get_label(), round(b.get_x() + b.get_width() / 2)): b.get_height()
            for c in containers for b in c.patches}
    expected = {(path, i): nums["x_floor"] for i, case in enumerate(results["cases"])
                for path, nums in case["paths"].items()}
    assert bars == expected  # one bar per (case, path) present, at its case's group, as tall as x_floor
    assert sum(len(c.patches) for c in containers) == 4 + 3 + 2
    assert ax.get_yscale() == "log"
    floor = [ln for ln in ax.get_lines() if ln.get_label() == "floor"]
    assert len(floor) == 1 and list(floor[0].get_ydata()) == [1.0, 1.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["decode-1M", "decode-128K", "mtp-2"]
    assert "NVIDIA H200" in ax.get_title()
    lo, hi = ax.get_ylim()
    assert lo < 1.0 and hi > 186.0
    save(fig, tmp_path / "bench.png")


def test_benchmark_bars_into_given_axes_and_round_trip_through_json(tmp_path):
    results = json.loads(json.dumps(bench_results()))
    del results["device"], results["date"]
    results["cases"].append({"case": "prefill-8K", "paths": {}})  # no measured path (torch missing)
    fig, ax = plt.subplots()
    assert plot.benchmark_bars(results, ax=ax) is fig
    assert len(ax.get_xticks()) == 4
    assert ax.get_title() == "time / floor per case and path"
    save(fig, tmp_path / "bench2.png")


@pytest.mark.parametrize("results, error, message", [
    ([1, 2], TypeError, "results: expected the dict"),
    ({}, ValueError, "results: expected a non-empty list 'cases'"),
    ({"cases": []}, ValueError, "non-empty list 'cases'"),
    ({"cases": [{"paths": {}}]}, ValueError, "cases[0]: expected a dict with 'case'"),
    ({"cases": [{"case": "a"}]}, ValueError, "cases[0]: expected a dict with 'case' and a dict 'paths'"),
    ({"cases": [{"case": "a", "paths": {"fast": {"ms": 1.0}}}]}, ValueError,
     "cases[0] (a) path 'fast': expected a positive number 'x_floor' up to 1e+12, got None"),
    ({"cases": [{"case": "a", "paths": {"fast": {"x_floor": 1e300}}}]}, ValueError, "got 1e+300"),  # log axis overflow
    ({"cases": [{"case": "a", "paths": {"fast": {"x_floor": -1}}}]}, ValueError, "got -1"),
    ({"cases": [{"case": "a", "paths": {"fast": {"x_floor": True}}}]}, ValueError, "x_floor"),
    ({"cases": [{"case": "a", "paths": {"fast": 3.0}}]}, ValueError, "x_floor"),
    ({"cases": [{"case": "a", "paths": {}}]}, ValueError, "results: no case has a measured path"),
])
def test_benchmark_bars_errors(results, error, message):
    with pytest.raises(error) as info:
        plot.benchmark_bars(results)
    assert message in str(info.value)


# ----------------------------------------------------------------------------- indexer plot


@pytest.fixture
def run(monkeypatch):
    """Invoke the CLI on the CPU; stdout and stderr come back separately."""
    monkeypatch.delenv("INDEXER_DEBUG", raising=False)
    monkeypatch.setattr(arrays, "gpu_available", lambda: False)  # 'auto' picks NumPy
    monkeypatch.setattr(arrays, "gpu_supported", lambda device_id=None: False)
    runner = separate_runner()

    def invoke(*args):
        return runner.invoke(cli.main, [str(a) for a in args])

    return invoke


def assert_error(result, *fragments):
    """A user error: exit 2, one 'error:' line on stderr, no traceback."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.fixture
def problem_path(tmp_path, rng):
    p = testing.random_problem(rng, T=4, H=4, D=32, E=8, lens=[40, 25, 3, 0], top_k=8)
    path = tmp_path / "problem.npz"
    io.write_arrays(path, dict(zip(io.PROBLEM_NAMES, p.arrays()), top_k=np.array(8, dtype=np.int32)))
    return path


@pytest.fixture
def bench_path(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench_results()))
    return path


def test_cli_plot_selection_is_the_default_for_arrays(run, problem_path, tmp_path):
    out = tmp_path / "selection.png"
    r = run("plot", problem_path, "--out", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"wrote selection plot to {out}"
    assert_png(out)


def test_cli_plot_scores(run, problem_path, tmp_path):
    out = tmp_path / "scores.png"
    r = run("plot", problem_path, "--kind", "scores", "--query", 1, "--top-k", 4, "--out", out)
    assert r.exit_code == 0, r.output
    assert "wrote scores plot" in r.stdout
    assert_png(out)
    r = run("plot", problem_path, "--kind", "scores", "--out", tmp_path / "empty.svg", "--backend", "numpy")
    assert r.exit_code == 0, r.output  # query 0 by default; other image types by extension
    assert (tmp_path / "empty.svg").read_bytes().lstrip().startswith(b"<?xml")


def test_cli_plot_scores_of_a_saved_pool(run, rng, tmp_path):
    pool = KeyPool(8, entries_per_block=8, head_dim=32)
    pool.append(7, rng.standard_normal((30, 32), dtype=np.float32))
    pool.append(9, rng.standard_normal((12, 32), dtype=np.float32))
    pool.save(tmp_path / "pool.npz")
    data = io.read_arrays(tmp_path / "pool.npz")
    data.update(q=rng.standard_normal((2, 4, 32), dtype=np.float32), w=rng.standard_normal((2, 4), dtype=np.float32),
                seqs=np.array([9, 7], dtype=np.int64))
    io.write_arrays(tmp_path / "pq.npz", data)
    for kind in ("scores", "selection"):
        out = tmp_path / f"{kind}.png"
        r = run("plot", tmp_path / "pq.npz", "--kind", kind, "--top-k", 5, "--out", out)
        assert r.exit_code == 0, r.output
        assert_png(out)


def test_cli_plot_bench_is_the_default_for_json(run, bench_path, tmp_path):
    out = tmp_path / "bench.png"
    r = run("plot", bench_path, "--out", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"wrote bench plot to {out}"
    assert_png(out)


def test_cli_plot_errors(run, problem_path, bench_path, tmp_path):
    out = tmp_path / "x.png"
    assert_error(run("plot", tmp_path / "absent.npz", "--out", out), "absent.npz: no such file")
    assert_error(run("plot", tmp_path / "absent.json", "--out", out), "absent.json: no such file")
    assert_error(run("plot", problem_path, "--kind", "heatmap", "--out", out), "Invalid value for '--kind'")
    assert_error(run("plot", problem_path), "Missing option '--out'")
    assert_error(run("plot", problem_path, "--out", tmp_path / "x.bogus"), "unknown image type ('.bogus')")
    assert_error(run("plot", problem_path, "--out", tmp_path / "noext"), "unknown image type (no extension)")
    assert_error(run("plot", problem_path, "--kind", "scores", "--query", 4, "--out", out),
                 "--query: 4 is out of range; the input has 4 queries")
    assert_error(run("plot", problem_path, "--query", 1, "--out", out), "--query: only used with --kind scores")
    assert_error(run("plot", bench_path, "--top-k", 3, "--out", out), "--top-k: not used with --kind bench")
    assert_error(run("plot", bench_path, "--kind", "selection", "--out", out), "unknown file type ('.json')")
    assert_error(run("plot", problem_path, "--kind", "bench", "--out", out), "not a readable JSON file")
    assert_error(run("plot", problem_path, "--top-k", 0, "--out", out), "top_k")
    assert not out.exists()


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("cases"), "expected a non-empty list 'cases'"),
    (lambda r: r["cases"][1].pop("paths"), "cases[1]: expected a dict with 'case' and a dict 'paths'"),
    (lambda r: r["cases"][0]["paths"]["exact"].pop("x_floor"), "cases[0] (decode-1M) path 'exact'"),
])
def test_cli_plot_bench_json_with_missing_keys(run, tmp_path, change, message):
    results = bench_results()
    change(results)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(results))
    assert_error(run("plot", path, "--out", tmp_path / "x.png"), f"{path}: results: ", message)
    path.write_text("[1, 2]")
    assert_error(run("plot", path, "--out", tmp_path / "x.png"), "results: expected the dict")


def test_cli_plot_without_matplotlib(run, problem_path, tmp_path, no_matplotlib):
    assert_error(run("plot", problem_path, "--out", tmp_path / "x.png"), MISSING)


def test_the_threshold_line_sits_at_the_lowest_score_when_fewer_than_k():
    fig = plot.score_distribution(np.array([1.0, 2.0, 3.0]), top_k=5)
    assert threshold_line(fig.axes[0])[0] == 1.0


def test_the_selection_maps_entry_axis_ends_past_the_largest_index_without_lengths():
    fig = plot.selection_map(np.array([[0, 9]], dtype=np.int32))
    assert fig.axes[0].get_xlim() == (-0.5, 9.5)


def test_benchmark_bars_draw_names_with_dollars_as_text(tmp_path):
    # a '$' starts matplotlib's math mode: a case named '$x^$' made the figure fail to draw
    results = {"cases": [{"case": "$x^$", "paths": {"$\\frac$": {"x_floor": 1.5}}}]}
    fig = plot.benchmark_bars(results)
    save(fig, tmp_path / "dollars.png")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [r"\$x^\$"]


def test_score_distribution_caps_a_rules_bins_and_refuses_unordered_edges(monkeypatch):
    monkeypatch.setattr(plot, "MAX_BINS", 5)
    with pytest.raises(ValueError, match="^bins: the rule 'sqrt' asks 10 bins of these scores, more than 5"):
        plot.score_distribution(np.arange(100.0), bins="sqrt")
    with pytest.raises(ValueError, match="^bins: expected increasing edges"):
        plot.score_distribution(np.arange(100.0), bins=[0.0, 2.0, 1.0])


def test_selection_map_ticks_are_whole_queries_and_entries():
    """Two queries over a few entries: every tick is a whole number (matplotlib's default
    put them at -0.5, -0.25, ...)."""
    fig = plot.selection_map(np.array([[0, 3], [1, -1]], np.int32), np.array([4, 2], np.int32))
    ax = fig.axes[0]
    for ticks in (ax.get_yticks(), ax.get_xticks()):
        assert len(ticks) and np.all(ticks == np.round(ticks)), ticks


def test_scores_at_plus_inf_are_counted_and_can_hold_the_threshold():
    """A score past float32's range comes back as +inf and is selectable: counted in the
    legend (off the axis), and a k-th score among them named there (before, +inf scores were
    dropped: "selected (1)" for four selected, the line at an unselected score)."""
    fig = plot.score_distribution(np.array([1.0, np.inf, 2.0]), top_k=1)
    ax = fig.axes[0]
    assert all(len(line.get_xdata()) == 0 for line in ax.get_lines())  # no line drawn: +inf has no place
    labels = ax.get_legend_handles_labels()[1]
    assert "all entries (3, 1 at +inf off the axis)" in labels
    assert "k-th score (k = 1): inf (off the axis)" in labels
    row = np.array([0.5, 1.0, np.inf, np.inf, np.inf, 3.0])
    sel = np.array([np.inf, np.inf, np.inf, 3.0], np.float32)
    ax = plot.score_distribution(row, sel).axes[0]  # k from the selection: 4
    labels = ax.get_legend_handles_labels()[1]
    assert "selected (4, 3 at +inf off the axis)" in labels
    assert threshold_line(ax) == (3.0, "k-th score (k = 4): 3")


@pytest.mark.parametrize("bins", [[0.0, np.nan, 1.0], [-np.inf, 0.0, np.inf]])
def test_score_distribution_refuses_edges_that_are_not_finite(bins):
    with pytest.raises(ValueError, match="^bins: expected finite edges$"):
        plot.score_distribution(np.random.default_rng(0).standard_normal(1000), bins=bins)


def test_narrow_float_scores_are_taken_as_their_values():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    row = np.linspace(-2.0, 2.0, 64).astype(ml_dtypes.bfloat16)
    ax = plot.score_distribution(row, top_k=3).axes[0]
    assert threshold_line(ax)[0] == float(np.sort(row.astype(np.float32))[-3])
    assert sum(p.get_height() for p in ax.patches) == 64


@pytest.mark.parametrize("indices, lens, message", [
    (np.array([[0, -7, 2]], np.int32), None, "^indices: expected entries >= 0 and -1 padding, got -7$"),
    (np.array([[0, 1, 2]], np.int32), np.array([-3], np.int32), "^valid_lens: expected lengths >= 0, got -3$"),
])
def test_selection_map_refuses_what_no_call_returns(indices, lens, message):
    with pytest.raises(ValueError, match=message):
        plot.selection_map(indices, lens)


def test_benchmark_bars_title_draws_dollars_as_text_and_paths_keep_their_own_colours(tmp_path):
    paths = {f"p{j}": {"x_floor": 1.0 + j} for j in range(23)}
    results = {"cases": [{"case": "a", "paths": paths}], "device": "$x^$", "date": "$"}
    fig = plot.benchmark_bars(results)
    save(fig, tmp_path / "many.png")  # drawn: a '$' in the title no longer starts math mode
    colours = [tuple(c.patches[0].get_facecolor()) for c in fig.axes[0].containers]
    assert len(colours) == 23 and len(set(colours)) == 23


def test_pytorch_scores_of_narrow_dtypes_and_tensors_without_values():
    """PyTorch bfloat16 and float8 scores are taken as their values; a sparse tensor or one on
    'meta' is refused naming the argument (before, PyTorch's own errors, naming nothing)."""
    torch = pytest.importorskip("torch")
    row = torch.linspace(-2.0, 2.0, 64)
    for dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        narrow = row.to(dtype)
        ax = plot.score_distribution(narrow, top_k=3).axes[0]
        assert threshold_line(ax)[0] == float(torch.sort(narrow.float()).values[-3])
    with pytest.raises(TypeError, match="^scores_row: expected a plain"):
        plot.score_distribution(row.to_sparse())
    with pytest.raises(TypeError, match="^scores_row: expected a tensor on the host or a CUDA GPU"):
        plot.score_distribution(row.to("meta"))
    idx = torch.tensor([[0, 3], [1, -1]], dtype=torch.int32)
    with pytest.raises(TypeError, match="^indices: expected a plain"):
        plot.selection_map(idx.to_sparse())
    with pytest.raises(TypeError, match="^valid_lens: expected a tensor on the host"):
        plot.selection_map(idx, torch.tensor([4, 2]).to("meta"))
