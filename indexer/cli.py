"""The ``indexer`` command line: ``demo``, ``score``, ``pack``, ``info``, ``bench`` and ``plot``.

Thin on purpose: reading and writing files is ``indexer.io``, scoring is
``indexer.score_topk``, the pool is ``indexer.KeyPool``, checking is ``indexer.testing``.

Errors from the library or from the files (``ValueError``, ``TypeError``, ``RuntimeError``
such as ``PoolFullError``, ``OSError``) and malformed command lines print one line,
``error: ...``, to stderr and exit with code 2; set ``INDEXER_DEBUG=1`` to get the
traceback instead. ``demo`` exits with 1 when its result does not match the reference.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
import time

import click
import numpy as np

from . import __version__, arrays, io, ops, runs, testing
from . import bench as _bench  # the case and path tables (no GPU import)

__all__ = ["main"]

_USER_ERRORS = (ValueError, TypeError, RuntimeError, OSError, MemoryError)  # MemoryError: NumPy's names the size


class CliError(click.ClickException):
    """A user-facing error: shown as one line ``error: ...`` on stderr, exit code 2."""

    exit_code = 2

    def show(self, file=None):
        click.echo(f"error: {self.format_message()}", err=True, file=file)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# click 8.2+: 'indexer' with no arguments raises this UsageError, its message the whole help
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _Group(click.Group):
    """Turns library errors and usage errors into one ``error:`` line."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _NO_ARGS_IS_HELP as exc:  # no command: the help itself, as older click prints it
            click.echo(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
            raise click.exceptions.Exit(0) from None
        except click.UsageError as exc:  # the group's own options ('indexer --bogus')
            raise CliError(f"{exc.format_message()} (see '{info_name} --help')") from None

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta["indexer.command"] = name  # for a usage error raised without its context
        return name, command, rest

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort, CliError):
            raise  # Exit and Abort are RuntimeErrors: let click handle them
        except click.UsageError as exc:
            # a subcommand's option missing its value comes without the subcommand's context
            where = exc.ctx.command_path if exc.ctx is not None else \
                " ".join(filter(None, (ctx.command_path, ctx.meta.get("indexer.command"))))
            raise CliError(f"{exc.format_message()} (see '{where} --help')") from None
        except _USER_ERRORS as exc:
            if os.environ.get("INDEXER_DEBUG", "0") not in ("", "0"):
                raise
            raise CliError(_one_line(exc)) from None


def _echo_json(obj, indent=2) -> None:
    click.echo(json.dumps(obj, indent=indent))


def _num(x):
    """A JSON-safe float: None for -inf padding (and any non-finite value)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _table(headers, rows) -> str:
    """Right-aligned columns under their headers."""
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.rjust(wd) for c, wd in zip(r, widths)) for r in cells)


def _top_rows(indices, scores, show=None):
    """(query, rank, index[, score]) rows, ``show`` ranks per query (all when None)."""
    rows = []
    T, k = indices.shape
    for t in range(T):
        for r in range(k if show is None else min(show, k)):
            row = [t, r, int(indices[t, r])]
            if scores is not None:
                row.append(f"{float(scores[t, r]):.6g}")
            rows.append(row)
    return rows


@click.group("indexer", cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="indexer")
def main():
    """Lightning indexer of DeepSeek-style sparse attention over NVFP4 keys in a paged pool.

    For every query token t, score each visible key s of its sequence with
    I[t, s] = sum_h w[t, h] * ReLU(q[t, h, :] . k[s, :]) and keep the top-k entries,
    on the GPU (CuPy) or with the NumPy reference.

    \b
    Examples:
      indexer demo --backend numpy
      indexer pack keys.npz --out pool.npz
      indexer score problem.npz --top-k 512 --out topk.npz
      indexer info
      indexer bench --cases decode-128K
      indexer plot problem.npz --out selection.png
    """


# ----------------------------------------------------------------------------- demo


def _resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "cuda" if arrays.gpu_supported() else "numpy"
    return backend


def _device_count() -> int:
    """CUDA devices CuPy sees (0 without CuPy or a GPU)."""
    cp = arrays.cupy()
    return 0 if cp is None else int(cp.cuda.runtime.getDeviceCount())


_DEVICE_HELP = "run on CUDA device N (default: CuPy's current device); see 'indexer info'."


def _use_device(device, backend="cuda", torch_too=False):
    """Run the rest of the command under ``cupy.cuda.Device(device)`` (nothing when None),
    and with ``torch_too`` also under ``torch.cuda.device(device)`` when PyTorch is installed
    (the benchmark's PyTorch paths allocate on torch's current device).

    A device the machine does not have, or a device with the NumPy backend, is a one-line
    error (exit code 2) before any work.
    """
    if device is None:
        return
    if backend == "numpy":
        raise CliError(f"--device {device}: runs on a GPU, but --backend is numpy")
    count = _device_count()
    if count == 0:
        raise CliError(f"--device {device}: no CUDA GPU is visible (CuPy with a usable GPU is required)")
    if device >= count:
        raise CliError(f"--device {device}: CuPy sees {count} CUDA device(s), numbered 0 to {count - 1}")
    ctx = click.get_current_context()  # gpu-only: from here on there is a GPU
    ctx.with_resource(arrays.cupy().cuda.Device(device))  # gpu-only
    if torch_too:  # gpu-only
        try:
            import torch  # noqa: PLC0415  (optional: only the benchmark's PyTorch paths use it)
        except ImportError:
            return
        if torch.cuda.is_available():
            ctx.with_resource(torch.cuda.device(device))


@main.command()
@click.option("--backend", type=click.Choice(ops.BACKENDS), default="auto", show_default=True,
              help="'auto' runs on the GPU when CuPy finds one the kernels run on (sm_80 or newer), else on NumPy.")
@click.option("--precision", type=click.Choice(ops.PRECISIONS), default="fast", show_default=True,
              help="GPU path: 'fast' (tensor cores, error <= 2**-11 of each score's magnitude) or 'exact' "
                   "(FP32, <= 1e-6). The NumPy backend is always exact.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="random seed of keys, queries and weights.")
@click.option("--queries", "T", type=click.IntRange(min=1), default=4, show_default=True,
              help="query tokens T; each reads its own sequence.")
@click.option("--entries", "N", type=click.IntRange(min=1), default=4096, show_default=True,
              help="key entries per sequence.")
@click.option("--top-k", "top_k", type=int, default=512, show_default=True, help="entries kept per query.")
@click.option("--show", type=click.IntRange(min=0), default=5, show_default=True,
              help="top entries printed per query.")
@click.option("--device", type=click.IntRange(min=0), default=None, metavar="N", help=_DEVICE_HELP)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of text.")
@click.pass_context
def demo(ctx, backend, precision, seed, T, N, top_k, show, device, as_json):
    """Score a realistic random case and check it against the float64 reference.

    H = 64 heads, D = 128, a KeyPool of 64-entry blocks holding T sequences of N Gaussian
    keys (NVFP4 on write), one random query per sequence, top_k 512 by default. Prints
    the backend, sizes, time, whether the result matches the reference, and each
    query's best entries. Exits with 1 when the check fails.

    \b
    Example:
      indexer demo --backend numpy --entries 1024 --top-k 64
    """
    from .pool import KeyPool  # noqa: PLC0415

    H, D, E = 64, 128, 64
    _use_device(device, backend)
    chosen = _resolve_backend(backend)
    if chosen == "cuda" and not arrays.gpu_available():
        raise RuntimeError("backend 'cuda': CuPy with a usable CUDA GPU is required (pip install cupy-cuda13x for CUDA 13 or cupy-cuda12x for CUDA 12)")
    rng = np.random.default_rng(seed)
    blocks = T * -(-N // E)
    if blocks * E > 2**31 - 1:  # the pool's int32 slots, said in the options' own terms
        raise click.BadParameter(f"{T} sequences of {N} entries need {blocks * E} pool slots, more than "
                                 "2**31 - 1", param_hint="'--queries' / '--entries'")
    on_gpu = chosen == "cuda"
    # on the GPU the pool and the queries live there, so the time is the kernels' alone
    pool = KeyPool(blocks, entries_per_block=E, head_dim=D, device="cuda" if on_gpu else "cpu")
    seqs = list(range(T))
    for s in seqs:
        pool.append(s, rng.standard_normal((N, D), dtype=np.float32))
    q = rng.standard_normal((T, H, D), dtype=np.float32)
    w = rng.standard_normal((T, H), dtype=np.float32)
    q_in, w_in = (arrays.to_cupy(q), arrays.to_cupy(w)) if on_gpu else (q, w)

    def run():
        out = pool.score_topk(q_in, w_in, seqs, top_k, backend=chosen, precision=precision, return_scores=True)
        return arrays.to_numpy(out[0]), arrays.to_numpy(out[1])  # waits for the device

    first_ms = None
    if on_gpu:  # pragma: no cover  (needs a GPU)
        # the first call compiles the kernels (or loads them from CuPy's cache): time it apart
        t0 = time.perf_counter()
        run()
        first_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    indices, scores = run()
    ms = (time.perf_counter() - t0) * 1e3

    problem = testing.Problem(
        q=q, w=w,
        keys_fp4=arrays.to_numpy(pool.keys_fp4), key_scale=arrays.to_numpy(pool.key_scale),
        key_gscale=arrays.to_numpy(pool.key_gscale),
        block_table=arrays.to_numpy(pool.block_table(seqs)), valid_lens=arrays.to_numpy(pool.lengths(seqs)),
        top_k=top_k)
    tol = testing.TOL_FAST if on_gpu and precision == "fast" else testing.TOL_EXACT
    try:
        testing.check_topk(problem, indices, scores, tol=tol)
        ok, check = True, "matches the reference"
    except AssertionError as exc:
        ok, check = False, f"does NOT match the reference: {_one_line(exc)}"

    sizes = {"queries": T, "heads": H, "head_dim": D, "entries_per_block": E, "entries_per_sequence": N,
             "pool_blocks": blocks, "top_k": top_k}
    if as_json:
        _echo_json({
            "backend": chosen, "sizes": sizes, "time_ms": ms, "first_call_ms": first_ms,
            "precision": precision if on_gpu else "exact", "ok": ok, "check": check, "tol": tol,
            "top": [[{"index": int(i), "score": _num(sc)} for i, sc in zip(indices[t, :show], scores[t, :show])]
                    for t in range(T)],
        })
    else:
        click.echo(f"backend   {chosen}" + (f", precision {precision}" if on_gpu else ""))
        click.echo(f"sizes     {T} queries x {H} heads x D {D}; {T} sequences x {N} entries "
                   f"in {blocks} blocks of {E}; top_k {top_k}")
        timing = f"{ms:.2f} ms" + (f" (first call {first_ms:.1f} ms, with kernel load)" if first_ms is not None else "")
        click.echo(f"time      {timing}")
        click.echo(f"check     {check} (tol {tol:g})")
        if show:
            click.echo()
            click.echo(_table(("query", "rank", "index", "score"), _top_rows(indices, scores, show)))
    if not ok:
        ctx.exit(1)


# ----------------------------------------------------------------------------- score


@main.command()
@click.argument("input_path", metavar="INPUT")
@click.option("--top-k", "top_k", type=int, default=None,
              help="entries kept per query (default: the array 'top_k' of INPUT).")
@click.option("--out", "out", default=None, metavar="FILE",
              help="write 'indices' (and 'scores' with --scores) to FILE (.npz, .safetensors or .npy).")
@click.option("--backend", type=click.Choice(ops.BACKENDS), default="auto", show_default=True,
              help="'auto' runs on the GPU when CuPy finds one the kernels run on (sm_80 or newer), else on NumPy.")
@click.option("--precision", type=click.Choice(ops.PRECISIONS), default="fast", show_default=True,
              help="GPU path: 'fast' (tensor cores) or 'exact' (FP32); NumPy is always exact.")
@click.option("--physical", is_flag=True, help="return pool slots block * E + slot instead of logical entries.")
@click.option("--scores/--no-scores", "with_scores", default=None,
              help="include the scores (default: yes on stdout, no in --out files).")
@click.option("--chunk", type=click.IntRange(min=1), default=1024, show_default=True,
              help="query rows scored per call: bounds the working memory of large files "
                   "(a progress bar shows on stderr when there is more than one chunk).")
@click.option("--device", type=click.IntRange(min=0), default=None, metavar="N", help=_DEVICE_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="print JSON instead of a table (a score that is not finite, as padding's -inf, is null; "
                   "padding's index is -1).")
def score(input_path, top_k, out, backend, precision, physical, with_scores, chunk, device, as_json):
    """Score the queries saved in INPUT and print or save their top-k entries.

    INPUT (.npz, .safetensors) holds either the seven score_topk arrays q, w, keys_fp4,
    key_scale, key_gscale, block_table, valid_lens, or a saved KeyPool (it has an array
    'pool_meta', see 'indexer pack') plus q (T,H,D), w (T,H) and seqs (T,), the integer
    sequence id each query reads. Either may hold top_k as a one-element integer array.
    Either may group its queries by sequence, as score_topk_ragged does (prefill): an
    int32 array cu_seqlens_q (B+1,) of row offsets, block_table (B,L) or seqs (B,) then
    holding one row or id per sequence (the pool form's rows see all of their sequence,
    or an int32 valid_lens (T,) each). Arrays are used as stored: a wrong dtype or shape
    is reported, never converted.

    Without --out, prints a table (query, rank, index, score); -1 pads rows with fewer
    than top_k visible entries.

    \b
    Examples:
      indexer score problem.npz --top-k 512
      indexer score pool_and_queries.npz --top-k 64 --physical --out topk.npz --scores
    """
    _use_device(device, backend)
    if out is not None:  # an output that cannot be written fails before the work
        if io.file_format(out) == ".npy" and with_scores:
            raise CliError(f"{out}: a .npy file holds one array, and --scores asks for two (indices, scores); "
                           "use .npz or .safetensors")
        io.check_format_writable(out)
        io.check_writable(out, inputs=(input_path,))
    data = io.read_arrays(input_path)
    problem, k, cu_seqlens_q = io.load_grouped_problem(data, top_k=top_k, name=input_path)
    runs.check_shapes(problem, k, cu_seqlens_q)
    cut = runs.runs_of(problem, cu_seqlens_q, chunk)
    runs.check_runs(problem, k, cut)  # every value, before any row is scored or a bar drawn
    # a bar only where there are runs to count (click's own hidden= needs click 8.2)
    bar = (click.progressbar(cut, label="scoring", file=sys.stderr) if len(cut) > 1
           else contextlib.nullcontext(cut))
    t0 = time.perf_counter()
    with bar as each_run:
        indices, scores = runs.score_runs(problem, k, cut, each_run, backend=backend, precision=precision,
                                          physical=physical, validate=False)
    ms = (time.perf_counter() - t0) * 1e3
    if out is not None:
        result = {"indices": indices}
        if with_scores:
            result["scores"] = scores
        io.write_arrays(out, result)
        if as_json:
            _echo_json({"out": out, "arrays": {n: list(a.shape) for n, a in result.items()}, "time_ms": ms})
        else:
            shapes = ", ".join(f"{n} {a.dtype}{tuple(a.shape)}" for n, a in result.items())
            click.echo(f"wrote {shapes} to {out} ({ms:.1f} ms)")
        return
    with_scores = True if with_scores is None else with_scores
    if as_json:
        obj = {"top_k": int(k), "physical": physical, "indices": indices.tolist()}
        if with_scores:
            obj["scores"] = [[_num(x) for x in row] for row in scores]
        _echo_json(obj, indent=None)  # one line: the arrays can be long
    else:
        headers = ("query", "rank", "index") + (("score",) if with_scores else ())
        click.echo(_table(headers, _top_rows(indices, scores if with_scores else None)))


# ----------------------------------------------------------------------------- pack


@main.command()
@click.argument("keys_path", metavar="KEYS")
@click.option("--out", "out", required=True, metavar="POOL", help="the pool file to write (.npz or .safetensors).")
@click.option("--entries-per-block", "E", type=click.IntRange(min=1), default=64, show_default=True,
              help="entries E of each pool block.")
@click.option("--num-blocks", "num_blocks", type=click.IntRange(min=1), default=None,
              help="pool size in blocks (default: exactly what the sequences need, at least 1).")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON.")
def pack(keys_path, out, E, num_blocks, as_json):
    """Quantize key sequences to NVFP4 into a paged KeyPool and save it.

    KEYS (.npz or .safetensors) holds one float32 (n, D) array per sequence; the array's
    name is the sequence id (a name of decimal digits becomes an int id, any other name a
    str id). Every sequence is appended to a new KeyPool, saved to POOL, which
    'indexer score' reads together with q, w and seqs arrays.

    \b
    Example:
      indexer pack keys.npz --out pool.npz --entries-per-block 64
    """
    from .pool import KeyPool  # noqa: PLC0415

    if io.file_format(out) == ".npy":
        raise ValueError(f"{out}: a pool is saved as .npz or .safetensors, not .npy")
    io.check_format_writable(out)  # before the work
    io.check_writable(out, inputs=(keys_path,))
    data = io.read_arrays(keys_path)
    sequences = io.key_sequences(data, name=keys_path)
    array_of = dict(zip(sequences, data))  # sequence id -> the file's array name ('007' for id 7)
    D = next(iter(sequences.values())).shape[1]
    needed = io.blocks_needed(sequences, E)
    blocks = num_blocks if num_blocks is not None else max(1, needed)
    try:
        pool = KeyPool(blocks, entries_per_block=E, head_dim=D)
    except ValueError as exc:  # named as this command's user knows them: KEYS' width, the options
        msg = str(exc)
        for arg, said in (("head_dim:", f"{keys_path}: its keys' dimension:"),
                          ("entries_per_block:", "--entries-per-block:"),
                          ("num_blocks:", "--num-blocks:" if num_blocks is not None
                           else f"--entries-per-block (KEYS need {blocks} blocks of {E} entries):")):
            if msg.startswith(arg):
                msg = said + msg[len(arg):]
        raise ValueError(msg) from None
    for sid, keys in sequences.items():
        try:
            pool.append(sid, keys)
        except ValueError as exc:  # named as this command's user knows them: the file's array
            raise ValueError(f"{keys_path}: array {array_of[sid]!r}: {exc}") from None
        except RuntimeError as exc:  # a full pool: --num-blocks too small
            raise ValueError(f"--num-blocks {blocks}: too few blocks for {keys_path}'s keys "
                             f"(they need {needed}): {exc}") from None
    pool.save(out)
    total = sum(a.shape[0] for a in sequences.values())
    empty = len(sequences) - len(pool.sequences)
    if as_json:
        _echo_json({"out": out, "sequences": len(pool.sequences), "keys": total, "head_dim": D, "blocks": blocks,
                    "blocks_used": needed, "entries_per_block": E, "empty_sequences": empty})
        return
    note = f"; {empty} empty sequence(s) hold no keys and are not stored" if empty else ""
    click.echo(f"packed {len(pool.sequences)} sequences ({total} keys, D {D}) into {blocks} blocks "
               f"of {E} entries ({needed} used{note}) -> {out}")


# ----------------------------------------------------------------------------- info


def _version_of(dist: str, module: str | None = None) -> str:
    try:
        from importlib import metadata  # noqa: PLC0415

        return metadata.version(dist)
    except Exception:  # noqa: BLE001  (not installed, or installed without metadata)
        pass
    try:
        mod = __import__(module or dist)
        return str(mod.__version__)
    except Exception:  # noqa: BLE001
        return "not installed"


def _cupy_version() -> str:
    try:
        import cupy  # noqa: PLC0415

        return str(cupy.__version__)
    except ImportError:
        return "not installed"
    except Exception as exc:  # noqa: BLE001  (installed but broken: say why)
        return f"unusable ({_one_line(exc)})"


def _gpu_state() -> dict:
    try:
        cp = arrays.cupy()
        if cp is None:
            return {"count": 0, "devices": [], "state": "no GPU"}
        devices = []
        for i in range(cp.cuda.runtime.getDeviceCount()):
            props = cp.cuda.runtime.getDeviceProperties(i)
            name = props["name"]
            devices.append({"id": i, "name": name.decode() if isinstance(name, bytes) else str(name),
                            "compute_capability": f"{props['major']}.{props['minor']}",
                            "supported": (props["major"], props["minor"]) >= arrays.MIN_COMPUTE_CAPABILITY})
        return {"count": len(devices), "devices": devices, "state": "ok"}
    except Exception as exc:  # noqa: BLE001  (a broken driver must not break 'info')
        return {"count": 0, "devices": [], "state": f"no GPU ({_one_line(exc)})"}


def _folder(getter_name: str):
    try:
        from . import _jit  # noqa: PLC0415

        return str(getattr(_jit, getter_name)()), None
    except Exception as exc:  # noqa: BLE001
        return None, _one_line(exc)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of text.")
def info(as_json):
    """Show versions, the GPUs CuPy sees, and where the kernel sources and cache are.

    \b
    Example:
      indexer info --json
    """
    versions = {
        "indexer": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "ml_dtypes": _version_of("ml_dtypes"),
        "click": _version_of("click"),
        "safetensors": _version_of("safetensors"),
        "cupy": _cupy_version(),
    }
    gpu = _gpu_state()
    kdir, kerr = _folder("kernel_dir")
    cdir, cerr = _folder("cache_dir")
    if as_json:
        _echo_json({"versions": versions, "gpu": gpu, "kernel_dir": kdir, "kernel_cache_dir": cdir,
                    "errors": {k: v for k, v in (("kernel_dir", kerr), ("kernel_cache_dir", cerr)) if v}})
        return
    rows = [(name, v) for name, v in versions.items()]
    if gpu["devices"]:
        oldest = ".".join(map(str, arrays.MIN_COMPUTE_CAPABILITY))
        rows += [(f"gpu {d['id']}", f"{d['name']} (compute capability {d['compute_capability']}"
                  + (")" if d["supported"] else f": the CUDA kernels need {oldest}; backend 'auto' takes NumPy)"))
                 for d in gpu["devices"]]
    else:
        rows.append(("gpu", gpu["state"]))
    rows.append(("kernels", kdir if kdir is not None else f"unavailable ({kerr})"))
    rows.append(("kernel cache", cdir if cdir is not None else f"unavailable ({cerr})"))
    width = max(len(r[0]) for r in rows)
    for name, v in rows:
        click.echo(f"{name.ljust(width)}  {v}")


# ----------------------------------------------------------------------------- bench


@main.command()
@click.option("--cases", default=None, metavar="LIST",
              help="comma-separated case names, or 'all' (default: the decode cases and mtp-2), or cases "
                   f"of your own shape: {_bench.CUSTOM_CASE_FORM}.")
@click.option("--paths", default=None, metavar="LIST",
              help=f"comma-separated paths among {', '.join(_bench.PATHS)} (default: {_bench.DEFAULT_PATHS}; "
                   "fast-ws, fast-wgmma, fast-mma, fast-single, fast-ks and fast-dense force one scoring kernel; fast-f16 "
                   "takes a float16 query, fast-f8 a float8_e4m3fn one (a PyTorch tensor); torch-* need PyTorch).")
@click.option("--repeats", type=click.IntRange(min=1, max=_bench.MAX_REPEATS), default=20, show_default=True,
              help="timed calls per path; the median is reported.")
@click.option("--device", type=click.IntRange(min=0), default=None, metavar="N", help=_DEVICE_HELP)
@click.option("--json", "json_path", default=None, metavar="FILE", help="also write every number as JSON to FILE.")
def bench(cases, paths, repeats, device, json_path):
    """Time the GPU paths against the floor and PyTorch, case by case (needs a GPU).

    Measures the copy bandwidth and the fp16 tensor rate first; the floor of a case is
    max(bytes / bandwidth, flops / rate). Prints one line per case and path: median ms,
    time / floor, TFLOP/s, GB/s, extra device memory (MB) and speed-up over
    torch-composed; kernel paths also as '(graph)', replayed from a CUDA graph. Cases:
    decode-1M, decode-128K, decode-latency, decode-ragged, decode-E256, mtp-2, mtp-3, mtp-4,
    prefill-8K, prefill-chunk, or KIND-BxN[-kK][-EE] for a shape of your own (KIND decode,
    ragged or mtpQ; B requests of N entries, top-k K, E entries a block). The same as
    'python scripts/bench.py'.

    \b
    Examples:
      indexer bench --cases decode-128K,mtp-2 --paths fast,torch-composed --json bench.json
      indexer bench --cases decode-8x131072-k512,mtp3-16x65536 --paths fast,fast-score
    """

    chosen = _bench.select_cases(_bench.DEFAULT_CASES if cases is None else cases)
    path_list = _bench.select_paths(_bench.DEFAULT_PATHS if paths is None else paths)
    if json_path is not None:
        io.check_writable(json_path, in_place=True)  # before the measurements; written where it is
    _use_device(device, torch_too=True)
    _bench.require_gpu()  # before the bar: without a GPU the error is the only output
    with click.progressbar(length=len(chosen) * len(path_list), label="benchmarking", file=sys.stderr) as bar:
        live = sys.stderr.isatty()

        def echo(line):
            if live:  # clear the bar's line; it is drawn again at the next step
                click.echo("\r\033[K", nl=False, err=True)
            click.echo(line)

        _bench.run(chosen, path_list, repeats, json_path=json_path, progress=lambda *_: bar.update(1), echo=echo)


# ----------------------------------------------------------------------------- plot

PLOT_KINDS = ("selection", "scores", "bench")
_FIGSIZE = {"selection": (7, 6), "scores": (7, 4), "bench": (6, 4.5)}


def _plot_kind(input_path, kind):
    """--kind, or its default: 'bench' for a .json INPUT, else 'selection'."""
    if kind is not None:
        return kind
    return "bench" if str(input_path).lower().endswith(".json") else "selection"


def _new_figure(figsize):
    """A matplotlib Figure outside pyplot (no backend, no GUI) and its one Axes."""
    from .plot import require_matplotlib  # noqa: PLC0415

    require_matplotlib()
    from matplotlib.figure import Figure  # noqa: PLC0415  (optional dependency)

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots()


def _check_image_path(out, fig):
    """ValueError unless matplotlib can write ``out``'s extension."""
    suffix = os.path.splitext(out)[1].lower().lstrip(".")
    kinds = fig.canvas.get_supported_filetypes()
    if suffix not in kinds:
        shown = repr("." + suffix) if suffix else "no extension"
        raise ValueError(f"{out}: unknown image type ({shown}); expected one of "
                         f"{', '.join('.' + k for k in sorted(kinds))}")


def _read_bench_json(path):
    """The dict ``indexer bench --json`` wrote to ``path``; ValueError naming the path."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: {'not a file' if os.path.exists(path) else 'no such file'}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({_one_line(exc)})") from None
    except RecursionError:  # nesting deeper than the parser's stack: no benchmark's JSON
        raise ValueError(f"{path}: not a readable JSON file (nested too deeply)") from None


def _plot_bench(ax, input_path):
    """Draw the bench JSON at ``input_path``; the figure widens with the number of cases."""
    from .plot import benchmark_bars  # noqa: PLC0415

    results = _read_bench_json(input_path)
    try:
        benchmark_bars(results, ax=ax)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{input_path}: {_one_line(exc)}") from None
    ax.figure.set_size_inches(max(6.0, 1.3 * len(ax.get_xticks()) + 2.5), 4.5)


def _one_query(problem, t):
    """The seven arrays restricted to query row ``t`` (rows of q, w, block_table, valid_lens)."""
    q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens = problem
    T = q.shape[0] if np.ndim(q) >= 1 else 0
    if not 0 <= t < T:
        raise ValueError(f"--query: {t} is out of range; the input has {T} queries")

    def row(a):
        return a[t : t + 1] if np.ndim(a) >= 1 else a

    return row(q), row(w), keys_fp4, key_scale, key_gscale, row(block_table), row(valid_lens)


def _plot_problem(ax, input_path, kind, query, top_k, backend):
    """Score INPUT's problem and draw its selection map, or one query's score histogram."""
    from . import plot as _plot, reference  # noqa: PLC0415

    problem, k = io.load_problem(io.read_arrays(input_path), top_k=top_k, name=input_path)
    name = os.path.basename(input_path)
    if kind == "selection":
        indices, _ = ops.score_topk(*problem, k, backend=backend, return_scores=True)
        _plot.selection_map(indices, problem[6], ax=ax, title=f"{name}: top-{k} selection")
        return
    one = _one_query(problem, query)
    _, selected = ops.score_topk(*one, k, backend=backend, return_scores=True)  # validates the row too
    q, w, keys_fp4, key_scale, key_gscale, block_table, valid_lens = (arrays.to_numpy(a) for a in one)
    row = reference.row_scores(q[0], w[0], keys_fp4, key_scale, key_gscale, block_table[0], int(valid_lens[0]))
    _plot.score_distribution(row, arrays.to_numpy(selected)[0], k, ax=ax, title=f"{name}: scores of query {query}")


@main.command()
@click.argument("input_path", metavar="INPUT")
@click.option("--out", "out", required=True, metavar="FILE",
              help="the image to write (.png, .svg, .pdf or another type matplotlib saves).")
@click.option("--kind", type=click.Choice(PLOT_KINDS), default=None,
              help="selection: which entries each query selects; scores: one query's score histogram "
                   "with the k-th score marked; bench: time / floor per case and path "
                   "(default: bench for a .json INPUT, else selection).")
@click.option("--query", "query", type=click.IntRange(min=0), default=None,
              help="--kind scores: the query row shown (default 0).")
@click.option("--top-k", "top_k", type=int, default=None,
              help="entries kept per query (default: the array 'top_k' of INPUT).")
@click.option("--backend", type=click.Choice(ops.BACKENDS), default="auto", show_default=True,
              help="where the selection is computed: 'auto' runs on the GPU when CuPy finds one the kernels run on (sm_80 or newer), else on NumPy.")
@click.option("--json", "as_json", is_flag=True, help="print what was written as JSON.")
def plot(input_path, out, kind, query, top_k, backend, as_json):
    """Plot a selection map, a score histogram or benchmark results to an image.

    For --kind selection and scores, INPUT is a problem file as 'indexer score' reads it
    (the seven score_topk arrays, or a saved KeyPool with q, w and seqs); it is scored,
    then 'selection' draws every query's selected entries (query down, entry across)
    with the visible length of each query, and 'scores' the histogram of every visible
    entry's score of query --query (float64 reference) with the k-th score marked. For
    --kind bench, INPUT is the JSON of 'indexer bench --json'. Needs matplotlib
    (pip install matplotlib).

    \b
    Examples:
      indexer plot problem.npz --out selection.png --top-k 64
      indexer plot problem.npz --kind scores --query 3 --out scores.png
      indexer plot bench.json --out bench.png
    """
    kind = _plot_kind(input_path, kind)
    if query is not None and kind != "scores":
        raise ValueError(f"--query: only used with --kind scores (this is --kind {kind})")
    if top_k is not None and kind == "bench":
        raise ValueError("--top-k: not used with --kind bench")
    try:
        fig, ax = _new_figure(_FIGSIZE[kind])
    except ImportError as exc:
        raise CliError(_one_line(exc)) from None
    _check_image_path(out, fig)  # an unknown image type fails before the work
    io.check_writable(out, in_place=True, inputs=(input_path,))  # (savefig writes the file where it is)
    if kind == "bench":
        _plot_bench(ax, input_path)
    else:
        _plot_problem(ax, input_path, kind, 0 if query is None else query, top_k, backend)
    fig.savefig(out, dpi=120)
    if as_json:
        _echo_json({"out": out, "kind": kind})
    else:
        click.echo(f"wrote {kind} plot to {out}")


if __name__ == "__main__":  # pragma: no cover
    main()
