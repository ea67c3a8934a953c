"""Plots of what the indexer selects and how fast it runs (matplotlib, the ``plot`` extra).

    pip install matplotlib        (or, from a checkout of this project: pip install ".[plot]")

* ``selection_map(indices, valid_lens)``: which entries each query selects (query on y,
  entry on x); for a prefill the causal staircase.
* ``score_distribution(scores_row, selected_scores, top_k)``: histogram of one query's
  scores with the k-th score (the selection threshold) marked.
* ``benchmark_bars(results)``: time / floor per case and path from ``indexer bench --json``.

Every function returns the matplotlib ``Figure``; pass ``ax`` to draw into axes of your
own (the function then only adds artists to them). Without ``ax`` a new figure is made
with ``matplotlib.pyplot``, under whatever backend is configured (inline in a notebook).
Inputs may be NumPy, CuPy or PyTorch arrays (copied to the host). matplotlib is imported
on the first call, not with this module.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import arrays

__all__ = ["selection_map", "score_distribution", "benchmark_bars", "require_matplotlib", "RASTER_ABOVE", "MAX_BINS"]

_MISSING = "indexer.plot needs matplotlib: pip install matplotlib"
#: above this many selected (query, entry) pairs the selection map is a raster, not a scatter
RASTER_ABOVE = 100_000
#: the raster's largest size in bins along each axis
_RASTER_BINS = 1024
#: score histograms switch to log counts when the fullest bin holds this many entries
_LOG_COUNTS = 50
#: the most bins a score histogram takes (matplotlib draws a patch a bin: 10**8 would not end)
MAX_BINS = 10_000
# the rules numpy.histogram_bin_edges takes by name
_BIN_RULES = ("auto", "fd", "doane", "scott", "stone", "rice", "sturges", "sqrt")
# the largest time / floor a benchmark bar takes (far past any measurement)
_MAX_X_FLOOR = 1e12


def require_matplotlib():
    """The ``matplotlib`` module, or ImportError "indexer.plot needs matplotlib: ...".

    Does not import ``pyplot`` and does not touch the backend.
    """
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    return matplotlib


def _axes(ax, figsize):
    """``ax``, or the axes of a new pyplot figure of ``figsize`` inches."""
    require_matplotlib()
    if ax is not None:
        from matplotlib.axes import Axes  # noqa: PLC0415  (optional dependency, imported on use)

        if not isinstance(ax, Axes):
            raise TypeError(f"ax: expected a matplotlib Axes or None, got {type(ax).__name__}")
        return ax
    import matplotlib.pyplot as plt  # noqa: PLC0415  (optional dependency, imported on use)

    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


# ----------------------------------------------------------------------------- selection map


def _on_host(x, name):
    """A NumPy array of ``x`` (NumPy, CuPy, PyTorch; copied to the host), a bfloat16 or float8
    array (ml_dtypes' or PyTorch's, any float8 format) widened to float32, whose every value
    it holds; TypeError
    naming ``name`` for a tensor that holds no values to read (sparse, nested, on 'meta')."""
    reason = arrays.torch_refusal(x, grad=False, sign=False)  # (to_numpy detaches and resolves signs)
    if reason is not None:
        raise TypeError(f"{name}: {reason}")
    if arrays.framework_of(x) == "torch" and x.is_floating_point() and arrays.dtype_name(x) not in _NUMPY_FLOATS:
        x = x.detach().float()  # a float type NumPy lacks (bfloat16, the float8s): its values
    a = arrays.to_numpy(x)
    if arrays.dtype_name(a) in _NARROW_FLOATS:  # ml_dtypes' types: NumPy sees kind 'V'
        a = a.astype(np.float32)
    return a


# float types NumPy holds itself
_NUMPY_FLOATS = ("float16", "float32", "float64")
# float types narrower than float16 that ml_dtypes gives NumPy (each value exact in float32)
_NARROW_FLOATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float4_e2m1fn")


def _selected_pairs(indices):
    """int64 (m,) query rows and (m,) entries of the selections in ``indices`` (T, k); -1 dropped."""
    rows, cols = np.nonzero(indices >= 0)
    return rows.astype(np.int64), indices[rows, cols].astype(np.int64)


def _as_indices(indices):
    idx = _on_host(indices, "indices")
    if idx.ndim != 2 or idx.dtype.kind not in "iu" or idx.shape[0] == 0:
        raise ValueError(f"indices: expected a 2-D integer array (T, top_k), T >= 1, got {idx.dtype} {idx.shape}")
    if idx.size and int(idx.min()) < -1:  # only -1 is padding: another negative is no entry
        raise ValueError(f"indices: expected entries >= 0 and -1 padding, got {int(idx.min())}")
    return idx


def _as_lens(valid_lens, T):
    if valid_lens is None:
        return None
    lens = _on_host(valid_lens, "valid_lens")
    if lens.shape != (T,) or lens.dtype.kind not in "iu":
        raise ValueError(f"valid_lens: expected an integer array of shape ({T},), got {lens.dtype} {lens.shape}")
    if T and int(lens.min()) < 0:
        raise ValueError(f"valid_lens: expected lengths >= 0, got {int(lens.min())}")
    return lens.astype(np.int64)


def _draw_scatter(ax, rows, entries, T):
    # square markers about one query row tall, at least 1 pt wide
    size = float(np.clip((400.0 / max(T, 1)) ** 2, 1.0, 16.0))
    ax.scatter(entries, rows, s=size, marker="s", linewidths=0, color="C0", label="selected")


def _draw_raster(ax, rows, entries, T, width):
    """Selections per bin as an image (bins of whole queries and entries, at most 1024 x 1024)."""
    ny, nx = min(T, _RASTER_BINS), min(width, _RASTER_BINS)
    counts, _, _ = np.histogram2d(rows, entries, bins=(ny, nx), range=((0, T), (0, width)))
    ax.imshow(np.ma.masked_equal(counts, 0), origin="upper", aspect="auto", interpolation="nearest",
              extent=(-0.5, width - 0.5, T - 0.5, -0.5), cmap="viridis")


def _draw_lens(ax, lens):
    """The visibility boundary: a vertical step at ``valid_lens[t]`` across query row t."""
    T = lens.shape[0]
    t = np.arange(T, dtype=np.float64)
    xs = np.repeat(lens - 0.5, 2)  # between the last visible entry and the first hidden one
    ys = np.stack([t - 0.5, t + 0.5], axis=1).ravel()
    ax.plot(xs, ys, color="C3", linewidth=1.0, label="valid_lens (visible entries)")


def selection_map(indices, valid_lens=None, *, ax=None, title=None, raster=None):
    """Which entries each query selects: query position (y, down) x entry position (x).

    Parameters
    ----------
    indices : int (T, top_k)     ``score_topk``'s output; -1 padding is left out. NumPy,
        CuPy or PyTorch. Logical entries (or physical slots with ``physical=True``).
    valid_lens : int (T,), optional   entries visible to each query, drawn as a step line
        (the causal staircase of a prefill).
    ax : matplotlib Axes, optional    draw into these axes instead of a new figure.
    title : str, optional             the axes' title (default: sizes and top_k).
    raster : bool, optional           draw selections per bin as an image instead of one
        marker each; default: a raster above ``RASTER_ABOVE`` selections.

    Returns the matplotlib ``Figure``. The scatter's offsets are the (entry, query) pairs.
    """
    _check_optional_flag("raster", raster)
    idx = _as_indices(indices)
    T, k = idx.shape
    lens = _as_lens(valid_lens, T)
    ax = _axes(ax, (7, 6))
    rows, entries = _selected_pairs(idx)
    width = max(int(entries.max(initial=-1)) + 1, int(lens.max(initial=0)) if lens is not None else 0, 1)
    if raster is None:
        raster = rows.size > RASTER_ABOVE
    if raster:
        _draw_raster(ax, rows, entries, T, width)
    else:
        _draw_scatter(ax, rows, entries, T)
    if lens is not None:
        _draw_lens(ax, lens)
        ax.legend(loc="upper right", fontsize="small")
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_ylim(T - 0.5, -0.5)  # query 0 at the top, as in an attention matrix
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415  (optional dependency, imported on use)

    for axis in (ax.xaxis, ax.yaxis):  # queries and entries are whole numbers: no tick at 0.25
        axis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("entry (key position)")
    ax.set_ylabel("query")
    ax.set_title(title if title is not None else f"top-{k} selection of {T} queries ({rows.size} selected)")
    return ax.figure


# ----------------------------------------------------------------------------- score distribution


def _scores_1d(x, name):
    """(float64 (m,) finite values, count of +inf) of a 1-D array of scores: NaN (never
    selectable) and -inf (padding) dropped; +inf (a score past float32's range) counted, as
    it is selectable but has no place on the axis."""
    a = _on_host(x, name)
    if a.ndim != 1 or a.dtype.kind not in "fiu":
        raise ValueError(f"{name}: expected a 1-D array of numbers, got {a.dtype} {a.shape}")
    a = a.astype(np.float64)
    return a[np.isfinite(a)], int(np.count_nonzero(a == np.inf))


def _kth_score(finite, above, top_k):
    """The ``top_k``-th highest of the scores ``finite`` (float64) and ``above`` more at +inf
    (the lowest when fewer); None if there are none."""
    k = min(int(top_k), finite.size + above)
    if k == 0:
        return None
    if k <= above:
        return math.inf
    k -= above
    return float(np.partition(finite, finite.size - k)[finite.size - k])


def _count_label(what, finite, above):
    """A legend label: ``what`` and how many, the +inf ones (off the axis) said apart."""
    extra = f", {above} at +inf off the axis" if above else ""
    return f"{what} ({finite.size + above}{extra})"


def _check_top_k(top_k):
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"top_k: expected a positive int, got {type(top_k).__name__} {top_k!r}")
    if top_k < 1:
        raise ValueError(f"top_k: expected a positive int, got {top_k!r}")
    return int(top_k)


def _check_optional_flag(name, value):
    """TypeError naming ``name`` unless ``value`` is None (the default rule) or a bool."""
    if value is not None and not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True, False or None, got {type(value).__name__} {value!r}")


def _check_bins(bins):
    """``bins`` as ``Axes.hist`` takes it (an int, a 1-D sequence of edges or a NumPy rule's
    name), an int at most ``MAX_BINS``; TypeError / ValueError naming ``bins``."""
    if isinstance(bins, str):
        if bins not in _BIN_RULES:
            raise ValueError(f"bins: expected an int, edges or one of {', '.join(_BIN_RULES)}, got {bins!r}")
        return bins
    if isinstance(bins, numbers.Integral) and not isinstance(bins, bool):
        if not 1 <= bins <= MAX_BINS:
            raise ValueError(f"bins: expected 1 to {MAX_BINS} bins, got {bins}")
        return int(bins)
    edges = np.asarray(bins) if not isinstance(bins, bool) else np.asarray(None)
    if edges.ndim != 1 or edges.dtype.kind not in "fiu" or not 2 <= edges.size <= MAX_BINS + 1:
        raise TypeError(f"bins: expected an int, a rule's name or 2 to {MAX_BINS + 1} increasing edges, "
                        f"got {type(bins).__name__}")
    edges = edges.astype(np.float64)
    if not np.all(np.isfinite(edges)):  # a NaN edge passes the order test below and draws negative counts
        raise ValueError("bins: expected finite edges")
    if np.any(np.diff(edges) <= 0):
        raise ValueError("bins: expected increasing edges")
    return edges


def _bin_edges(values, bins, span):
    """The histogram's edges over ``values`` (float64, finite) in ``span``; ValueError naming
    ``scores_row`` where NumPy cannot split their range into ``bins`` bins (values at the
    ends of float64's range, or a range narrower than the bins)."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # a span past float64's range: refused below
            edges = np.histogram_bin_edges(values, bins=bins, range=span)
    except ValueError as exc:
        raise ValueError(f"scores_row: its scores' range cannot be cut into these bins ({exc}); "
                         "pass bins= as edges") from None
    if edges.size - 1 > MAX_BINS:  # a rule's count ('fd' on skewed scores: millions)
        raise ValueError(f"bins: the rule {bins!r} asks {edges.size - 1} bins of these scores, more than "
                         f"{MAX_BINS}; pass a number of bins")
    return edges


def score_distribution(scores_row, selected_scores=None, top_k=None, *, ax=None, bins=100, title=None,
                       log=None):
    """Histogram of one query's scores with the k-th score (the selection threshold) marked.

    Parameters
    ----------
    scores_row : float (n,)   every visible entry's score for one query, e.g.
        ``indexer.reference.row_scores(...)``; NaN (never selectable) and -inf (padding)
        are left out; +inf (a score past float32's range) is counted in the legend, off
        the axis.
    selected_scores : float (top_k,), optional   the returned scores of that query
        (``return_scores=True``), drawn as a second histogram on the same bins; -inf
        padding left out, +inf counted as above.
    top_k : int, optional   k of the threshold line; default: the number of selected
        scores that are not padding or NaN. The vertical line sits at the k-th highest
        score of ``scores_row`` (the lowest one when fewer); a k-th score at +inf is named
        in the legend, with no line; no line without ``top_k`` or ``selected_scores``.
    ax : matplotlib Axes, optional; bins : int or sequence, as ``Axes.hist``; title : str.
    log : bool, optional   log-scale counts; default: when the fullest bin holds >= 50
        entries (then the few selected entries in the tail stay visible).

    Returns the matplotlib ``Figure``.
    """
    top_k = _check_top_k(top_k)
    _check_optional_flag("log", log)
    bins = _check_bins(bins)
    finite, above = _scores_1d(scores_row, "scores_row")
    selected, selected_above = (None, 0) if selected_scores is None else _scores_1d(selected_scores,
                                                                                    "selected_scores")
    if top_k is None and selected is not None and selected.size + selected_above:
        top_k = int(selected.size + selected_above)
    ax = _axes(ax, (7, 4))
    edges = bins
    span = None  # the bins over both sets: a float32 selected score can round past the row's float64 maximum
    if finite.size and selected is not None and selected.size and np.ndim(bins) == 0:
        span = (min(finite.min(), selected.min()), max(finite.max(), selected.max()))
    if finite.size:
        edges = _bin_edges(finite, bins, span)
        counts, edges, _ = ax.hist(finite, bins=edges, color="C0", alpha=0.8,
                                   label=_count_label("all entries", finite, above))
        if log or (log is None and counts.max() >= _LOG_COUNTS):
            ax.set_yscale("log")
    elif above:  # every score at +inf: nothing to draw, the count still said
        ax.plot([], [], color="C0", label=_count_label("all entries", finite, above))
    if selected is not None and selected.size:
        ax.hist(selected, bins=edges, color="C1", alpha=0.9,
                label=_count_label("selected", selected, selected_above))
    elif selected_above:
        ax.plot([], [], color="C1", label=_count_label("selected", selected, selected_above))
    threshold = _kth_score(finite, above, top_k) if top_k else None
    if threshold is not None:
        k = min(top_k, finite.size + above)
        label = f"k-th score (k = {k}): {threshold:.4g}"
        if math.isinf(threshold):  # no place on the axis: named in the legend only
            ax.plot([], [], color="C3", linestyle="--", linewidth=1.2, label=label + " (off the axis)")
        else:
            ax.axvline(threshold, color="C3", linestyle="--", linewidth=1.2, label=label)
    if finite.size or above or (selected is not None and selected.size + selected_above):
        ax.legend(fontsize="small")
    ax.set_xlabel("score")
    ax.set_ylabel("entries")
    infinite = f", {above} at +inf" if above else ""
    ax.set_title(title if title is not None else f"scores of one query ({finite.size} finite{infinite})")
    return ax.figure


# ----------------------------------------------------------------------------- benchmark bars


def _positive(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _literal(label) -> str:
    """``label`` as text matplotlib draws as it is: a '$' would start its math mode (a name
    like '$x^$' made the figure fail to draw)."""
    return str(label).replace("$", r"\$")


def _bench_cases(results):
    """``[(case name, {path: x_floor})]`` from ``indexer.bench.run``'s results; ValueError naming what is wrong."""
    if not isinstance(results, dict):
        raise TypeError(f"results: expected the dict that indexer.bench.run returns, got {type(results).__name__}")
    cases = results.get("cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError("results: expected a non-empty list 'cases' (the JSON of 'indexer bench --json')")
    out = []
    for i, row in enumerate(cases):
        if not isinstance(row, dict) or "case" not in row or not isinstance(row.get("paths"), dict):
            raise ValueError(f"results: cases[{i}]: expected a dict with 'case' and a dict 'paths'")
        name = _literal(row["case"])
        paths = {}
        for path, numbers_ in row["paths"].items():
            x = numbers_.get("x_floor") if isinstance(numbers_, dict) else None
            if not _positive(x) or x > _MAX_X_FLOOR:  # beyond, matplotlib's log axis overflows
                raise ValueError(f"results: cases[{i}] ({name}) path {path!r}: expected a positive number "
                                 f"'x_floor' up to {_MAX_X_FLOOR:g}, got {x!r}")
            paths[_literal(path)] = float(x)
        out.append((name, paths))
    if not any(paths for _, paths in out):
        raise ValueError("results: no case has a measured path")
    return out


def _path_order(cases):
    """Every path in order of first appearance."""
    order = {}
    for _, paths in cases:
        for p in paths:
            order.setdefault(p, None)
    return list(order)


def _path_colour(j, count):
    """Path ``j``'s bar colour of ``count`` paths, no two alike: matplotlib's cycle ("C0".."C9")
    for up to ten, "tab20" for up to twenty, evenly spaced hues of "turbo" past that."""
    import matplotlib  # noqa: PLC0415  (optional dependency, imported on use)

    if count <= 10:
        return f"C{j}"
    if count <= 20:
        return matplotlib.colormaps["tab20"](j)
    return matplotlib.colormaps["turbo"](j / (count - 1))


def benchmark_bars(results, *, ax=None):
    """Grouped bars of time / floor (``x_floor``) per case and path, log y, a line at 1.0.

    Parameters
    ----------
    results : dict   what ``indexer.bench.run`` returns and ``indexer bench --json`` writes:
        ``results["cases"][i]["case"]`` (name) and ``results["cases"][i]["paths"][path]["x_floor"]``
        (time / floor, > 0); ``device`` and ``date``, when present, go in the title.
        A path missing from a case leaves a gap in that case's group.
    ax : matplotlib Axes, optional

    Returns the matplotlib ``Figure``: one bar per (case, path) present, one colour per path.
    Raises TypeError / ValueError (starting "results:") for a dict of another layout.
    """
    cases = _bench_cases(results)
    paths = _path_order(cases)
    ax = _axes(ax, (max(6.0, 1.3 * len(cases) + 2.5), 4.5))
    width = 0.8 / len(paths)
    for j, path in enumerate(paths):
        offset = (j - (len(paths) - 1) / 2) * width
        xs = [i + offset for i, (_, p) in enumerate(cases) if path in p]
        ys = [p[path] for _, p in cases if path in p]
        ax.bar(xs, ys, width, label=path, color=_path_colour(j, len(paths)))
    values = [x for _, p in cases for x in p.values()]
    ax.set_yscale("log")
    ax.set_ylim(min(1.0, min(values)) / 1.5, max(1.0, max(values)) * 1.5)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1.0, label="floor")
    ax.set_xticks(range(len(cases)), [name for name, _ in cases], rotation=20, ha="right")
    ax.set_ylabel("time / floor (log)")
    where = " ".join(_literal(results[k]) for k in ("device", "date") if results.get(k))
    ax.set_title("time / floor per case and path" + (f"  ({where})" if where else ""))
    ax.legend(fontsize="small", ncols=min(len(paths) + 1, 3))
    return ax.figure
