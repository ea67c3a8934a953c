"""Side-by-side benchmark of the indexer against its floor and its peers, in one run.

    python scripts/bench.py                          # decode cases, the default paths
    python scripts/bench.py --cases decode-128K,mtp-2 --paths exact,torch-composed
    python scripts/bench.py --json out.json
    indexer bench --cases decode-128K --json out.json   # the same, with a progress bar

Per case it prints one aligned line per path: median ms, time/floor, TFLOP/s, GB/s, extra
device memory (MB) and speed-up over torch-composed. The floor is
max(bytes / copy bandwidth, flops / fp16 tensor rate) with both ceilings measured in this run
(the README's "Performance" section). Inputs are random NVFP4 pools (never zeros); cases
whose inputs fit in L2 rotate several input sets.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import arrays, io, nvfp4
from .validate import MAX_TOP_K
from .workspace import Workspace

# CuPy, PyTorch and indexer.cuda_ops are imported inside the functions that need them:
# this module imports, and its layout arithmetic runs, without a GPU.

__all__ = [
    "Case",
    "CASES",
    "DEFAULT_CASES",
    "DEFAULT_PATHS",
    "PATHS",
    "GPUUnavailable",
    "select_cases",
    "custom_case",
    "case_named",
    "CUSTOM_CASE",
    "select_paths",
    "header",
    "case_layout",
    "floor_seconds",
    "build",
    "run",
    "main",
]

H, D = 64, 128
L2_BYTES = 60 << 20
NO_GPU = "bench: needs CuPy and a CUDA GPU"


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    seqs: int            # sequences (requests)
    queries_per_seq: int
    top_k: int
    E: int = 64
    kind: str = "decode"  # decode | ragged | mtp | prefill
    entries: int = 0      # visible entries per query (decode), prefix length (prefill)
    prefill_tokens: int = 0
    ratio: int = 4


CASES = [
    Case("decode-1M", "V4-Pro decode at 1M context", 64, 1, 1024, entries=262_144),
    Case("decode-128K", "V4-Flash decode at 128K", 128, 1, 512, entries=32_768),
    Case("decode-latency", "one request, 1M context", 1, 1, 1024, entries=262_144),
    Case("decode-ragged", "mixed batch, lengths uniform in [1, 262144]", 64, 1, 1024, kind="ragged", entries=262_144),
    Case("decode-E256", "256-entry blocks", 64, 1, 1024, E=256, entries=65_536),
    Case("mtp-2", "two draft tokens per request", 64, 2, 1024, kind="mtp", entries=65_536),
    Case("mtp-3", "three query tokens per request (an odd count: a row of each alone)", 64, 3, 1024, kind="mtp",
         entries=65_536),
    Case("mtp-4", "four query tokens per request", 64, 4, 1024, kind="mtp", entries=65_536),
    Case("prefill-8K", "one sequence, 8192 tokens, 4:1", 1, 8192, 512, kind="prefill", entries=0, prefill_tokens=8192),
    Case("prefill-chunk", "4096 new tokens after 1M", 1, 4096, 1024, kind="prefill", entries=262_144, prefill_tokens=4096),
]
DEFAULT_CASES = "decode-1M,decode-128K,decode-latency,decode-ragged,decode-E256,mtp-2"
DEFAULT_PATHS = "fast,fast-score,exact,torch-composed,torch-topk"
#: the most timed calls a path takes (each replay up to ~30 ms: at most ~5 min a path)
MAX_REPEATS = 10_000
KERNEL_PATHS = ("fast", "fast-score", "exact", "exact-score", "fast-mma", "fast-mma-score", "fast-single",
                "fast-single-score", "fast-ws", "fast-ws-score", "fast-wgmma", "fast-wgmma-score", "fast-ks",
                "fast-ks-score", "fast-dense", "fast-dense-score", "fast-f16", "fast-f16-score", "fast-f8",
                "fast-f8-score")
# "prepared": an indexer.prepare-d call given out=, launched from Python each time (host time
# included), which replays a graph of its own once an input set's arrays come a second time
PATHS = KERNEL_PATHS + ("prepared", "torch-composed", "torch-topk")
#: the case column's width: the table's names fit it; a longer name of the caller's own
#: (CUSTOM_CASE) widens it for the whole run
CASE_WIDTH = 15


def header(width: int = CASE_WIDTH) -> str:
    """The table's header line, its case column ``width`` wide."""
    return (f"{'case':{width}s} {'path':20s} {'ms':>9s} {'x floor':>8s} {'TFLOP/s':>8s} {'GB/s':>8s} "
            f"{'extra MB':>9s} {'vs torch':>8s}")


HEADER = header()


class GPUUnavailable(RuntimeError):
    """The benchmark was asked to run where CuPy finds no CUDA GPU."""


# ----------------------------------------------------------------------------- selection


#: a case of the caller's own shape, named by it: KIND-BxN[-kK][-EE], KIND one of decode,
#: ragged (lengths uniform in [1, N]) or mtpQ (Q query rows a request, Q >= 2); B requests,
#: N entries a request, top_k K (default 1,024), block size E (default 64): e.g.
#: decode-8x131072-k512, mtp3-16x65536, ragged-32x262144-E256
CUSTOM_CASE = re.compile(r"(decode|ragged|mtp(\d{1,9}))-(\d{1,9})x(\d{1,9})(?:-k(\d{1,9}))?(?:-E(\d{1,9}))?")
CUSTOM_CASE_FORM = "KIND-BxN[-kK][-EE] (KIND decode, ragged or mtpQ; e.g. decode-8x131072-k512)"
#: the most entries a request of a custom case may have, query rows in all (each 32 KB of
#: float32 query), and (row, entry) pairs in all (~72 bytes of keys an entry: 2^28 entries
#: are ~19 GB of pool)
CUSTOM_MAX_ENTRIES = 1 << 22
CUSTOM_MAX_ROWS = 1 << 16
CUSTOM_MAX_PAIRS = 1 << 28


def custom_case(name: str, arg: str = "--cases") -> Case | None:
    """The Case a name of CUSTOM_CASE's form describes, or None for a name of another form;
    ValueError naming ``arg`` for a name of that form with numbers out of range."""
    m = CUSTOM_CASE.fullmatch(name)
    if m is None:
        return None
    kind, q, b, n, k, e = m.groups()
    queries = int(q) if q is not None else 1
    seqs, entries = int(b), int(n)
    top_k, E = int(k or 1024), int(e or 64)
    problems = [what for what, bad in (
        ("B >= 1", seqs < 1), (f"1 <= N <= {CUSTOM_MAX_ENTRIES}", not 1 <= entries <= CUSTOM_MAX_ENTRIES),
        (f"B x Q <= {CUSTOM_MAX_ROWS}", seqs * queries > CUSTOM_MAX_ROWS),
        (f"B x Q x N <= {CUSTOM_MAX_PAIRS}", seqs * queries * entries > CUSTOM_MAX_PAIRS),
        ("mtpQ with Q >= 2", q is not None and queries < 2),
        (f"1 <= K <= {MAX_TOP_K}", not 1 <= top_k <= MAX_TOP_K), ("1 <= E <= 1024", not 1 <= E <= 1024)) if bad]
    if problems:
        raise ValueError(f"{arg}: {name!r} needs {', '.join(problems)}")
    what = {"decode": f"{seqs} requests, {entries} entries", "ragged": f"{seqs} requests, lengths up to {entries}",
            "mtp": f"{seqs} requests x {queries} rows, {entries} entries"}[kind if q is None else "mtp"]
    return Case(name, what, seqs, queries, top_k, E=E, kind="mtp" if q is not None else kind, entries=entries)


def case_named(name: str, arg: str = "--cases") -> Case | None:
    """The table's case of that name, else the case a name of CUSTOM_CASE's form describes
    (``custom_case``, which raises ValueError naming ``arg``), else None."""
    return next((c for c in CASES if c.name == name), None) or custom_case(name, arg)


def select_cases(spec: str, strict: bool = True) -> list[Case]:
    """The cases named in ``spec`` (a comma list, or 'all'): the table's in its order, then
    any of CUSTOM_CASE's form in the order given.

    With ``strict`` an unknown name raises ValueError listing the known ones; without it
    unknown names are ignored (what ``scripts/bench.py`` has always done). A name of
    CUSTOM_CASE's form with numbers out of range raises ValueError either way.
    """
    if not isinstance(spec, str):
        raise TypeError(f"--cases: expected a comma list of case names or 'all', got {type(spec).__name__}")
    known = [c.name for c in CASES]
    names = known if spec == "all" else spec.split(",")
    custom = {n: case for n in dict.fromkeys(names) if n not in known and (case := custom_case(n)) is not None}
    unknown = [n for n in names if n not in known and n not in custom]
    if strict and unknown:
        raise ValueError(f"--cases: unknown case {', '.join(repr(n) for n in unknown)} "
                         f"(known: {', '.join(known)}, or 'all', or a case of your own: {CUSTOM_CASE_FORM})")
    return [c for c in CASES if c.name in names] + list(custom.values())


def select_paths(spec: str) -> list[str]:
    """The paths named in ``spec`` (a comma list), in the given order; unknown names raise ValueError."""
    if not isinstance(spec, str):
        raise TypeError(f"--paths: expected a comma list of path names, got {type(spec).__name__}")
    paths = spec.split(",")
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise ValueError(f"--paths: unknown path {', '.join(repr(p) for p in unknown)} (known: {', '.join(PATHS)})")
    return paths


# ----------------------------------------------------------------------------- layout and floor


def case_layout(case: Case, seed: int) -> dict:
    """The host side of one case: lengths, block table and the counts the floor needs.

    NumPy only. Returns a dict with
      ``seq_lens``    (seqs,) entries stored per sequence,
      ``valid_lens``  (T,) int32 entries visible to each query,
      ``block_table`` (T, L) int32, every sequence's blocks at random distinct physical
                      blocks (one permutation of the pool), -1 past its last block; the
                      queries of one sequence share its row,
      ``counts``      dict(T, pairs, bytes, flops, P, L): pairs = sum(valid_lens),
                      flops = 2 H D pairs, bytes = the keys once per sequence (D/2 + D/16
                      per entry, 4 per block) plus q, w and the output indices.
    The random draws (ragged lengths, then the permutation) come from
    ``np.random.default_rng(seed)`` in that order.
    """
    rng = np.random.default_rng(seed)
    E = case.E
    T = case.seqs * case.queries_per_seq
    if case.kind == "prefill":
        t = np.arange(case.prefill_tokens)
        lens = case.entries + (t + 1) // case.ratio
        seq_len = np.array([int(lens.max())])
    elif case.kind == "ragged":
        seq_len = rng.integers(1, case.entries + 1, size=case.seqs)
        lens = seq_len
    elif case.kind == "mtp":
        seq_len = np.full(case.seqs, case.entries + case.queries_per_seq - 1)
        lens = (np.full((case.seqs, case.queries_per_seq), case.entries) + np.arange(case.queries_per_seq)).reshape(-1)
    else:
        seq_len = np.full(case.seqs, case.entries)
        lens = seq_len
    blocks = -(-seq_len // E)
    P = int(blocks.sum())
    L = int(blocks.max())
    perm = rng.permutation(P).astype(np.int32)
    # sequence s takes perm[start_s : start_s + blocks[s]], sequences in order: row-major
    # filling of the visible part of the table
    table = np.full((case.seqs, L), -1, dtype=np.int32)
    table[np.arange(L)[None, :] < blocks[:, None]] = perm
    block_table = np.repeat(table, case.queries_per_seq if case.kind != "prefill" else T, axis=0)
    pairs = int(lens.sum())
    key_entries = int(seq_len.sum())  # each key counted once, however many queries see it
    key_bytes = key_entries * (D // 2 + D // 16) + int(blocks.sum()) * 4
    io_bytes = T * H * D * 4 + T * H * 4 + T * case.top_k * 4
    counts = dict(T=T, pairs=pairs, bytes=key_bytes + io_bytes, flops=2 * H * D * pairs, P=P, L=L)
    # queries grouped by sequence (varlen offsets) where several share one: the GPU path then
    # scores rows of a sequence in pairs that share each key tile
    q_per = T if case.kind == "prefill" else case.queries_per_seq
    cu = np.arange(0, T + 1, q_per, dtype=np.int32) if q_per > 1 else None
    return dict(seq_lens=seq_len, valid_lens=lens.astype(np.int32), block_table=block_table, counts=counts,
                cu_seqlens=cu)


def floor_seconds(counts: dict, bandwidth: float, rate: float) -> float:
    """max(bytes / bandwidth, flops / rate): the time no implementation can beat (seconds)."""
    return max(counts["bytes"] / bandwidth, counts["flops"] / rate)


def rotation_sets(one_set_bytes: int) -> int:
    """How many input sets to rotate: up to 4, enough to exceed 3x L2 when one set fits in it."""
    return min(4, max(1, (3 * L2_BYTES) // max(one_set_bytes, 1)))


# ----------------------------------------------------------------------------- rows and lines


def path_numbers(ms: float, extra_mb: float, counts: dict, floor_s: float) -> dict:
    """One path's JSON numbers from its median milliseconds (``vs_torch`` is added later)."""
    s = ms * 1e-3
    return dict(ms=ms, x_floor=s / floor_s, tflops=counts["flops"] / s / 1e12,
                gbs=counts["bytes"] / s / 1e9, extra_mb=extra_mb)


def format_line(case_name: str, path: str, line: dict, torch_ms: float | None, width: int = CASE_WIDTH) -> str:
    """One aligned table line (the case column ``width`` wide, as ``header``'s); the
    speed-up column is empty for torch-composed itself."""
    speed = f"{torch_ms / line['ms']:.1f}x" if torch_ms and path != "torch-composed" else ""
    return (f"{case_name:{width}s} {path:20s} {line['ms']:9.4f} {line['x_floor']:8.2f} {line['tflops']:8.1f} "
            f"{line['gbs']:8.0f} {line['extra_mb']:9.1f} {speed:>8s}")


# README's labels of the cases, for ``markdown_table``
README_LABELS = {
    "decode-1M": "decode-1M (B 64, 262,144 entries, k 1024)",
    "decode-128K": "decode-128K (B 128, 32,768, k 512)",
    "decode-latency": "decode-latency (B 1, 262,144, k 1024)",
    "decode-ragged": "decode-ragged (B 64, lengths up to 262,144)",
    "decode-E256": "decode-E256 (256-entry blocks)",
    "mtp-2": "mtp-2 (B 64 x 2, 65,536)",
    "mtp-3": "mtp-3 (B 64 x 3, 65,536)",
    "mtp-4": "mtp-4 (B 64 x 4, 65,536)",
    "prefill-8K": "prefill-8K (8,192 causal queries, k 512)",
    "prefill-chunk": "prefill-chunk (4,096 queries, 262,144 + causal)",
}
TABLE_HEADER = ("| case | fast (graph) | x floor | scoring alone | eager call | exact (graph) | torch-composed "
                "| fast vs torch |\n| --- | --- | --- | --- | --- | --- | --- | --- |")


def _ms(ms: float | None) -> str:
    """Milliseconds as the README writes them: 3 significant digits."""
    return "" if ms is None else f"{float(f'{ms:.3g}'):g} ms"


def markdown_table(results: dict, exact_from: dict | None = None) -> str:
    """README's performance table from ``run``'s results (its JSON): a row a case, in its
    order. ``exact_from``: the results of another run to take the exact column from, where
    this one did not measure it (the exact path is slow to time). Empty cells where a path
    is missing."""
    def path(row, name):
        line = row["paths"].get(name)
        return line["ms"] if line else None

    older = {row["case"]: row for row in (exact_from or {}).get("cases", [])}
    lines = [TABLE_HEADER]
    for row in results["cases"]:
        fast = row["paths"].get("fast (graph)")
        exact = path(row, "exact (graph)")
        if exact is None and row["case"] in older:
            exact = path(older[row["case"]], "exact (graph)")
        torch_ms = path(row, "torch-composed")
        cells = [README_LABELS.get(row["case"], row["case"]),
                 _ms(fast["ms"]) if fast else "", f"{fast['x_floor']:.2f}" if fast else "",
                 _ms(path(row, "fast-score (graph)")), _ms(path(row, "fast")), _ms(exact), _ms(torch_ms),
                 f"{torch_ms / fast['ms']:.0f}x" if fast and torch_ms else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- device side


def require_gpu():
    """The CuPy module; GPUUnavailable (a RuntimeError) when there is no CuPy or no GPU."""
    cp = arrays.cupy()
    if cp is None:
        raise GPUUnavailable(NO_GPU)
    return cp


def _gpu_modules():  # gpu-only
    """(cupy, indexer.cuda_ops, torch or None)."""
    cp = require_gpu()
    from . import cuda_ops  # noqa: PLC0415  (imports CuPy)

    try:
        import torch  # noqa: PLC0415
    except ImportError:
        torch = None
    return cp, cuda_ops, torch


def build(case: Case, cp, seed: int):  # gpu-only
    """Device arrays for one case (layout from ``case_layout``), and the counts the floor needs."""
    lay = case_layout(case, seed)
    P, E, T = lay["counts"]["P"], case.E, lay["counts"]["T"]
    g = cp.random.default_rng(seed)
    keys_fp4 = g.integers(0, 256, size=(P, E, D // 2), dtype=cp.uint8)
    # scales: E4M3 bytes 0x28..0x47 (0.25 .. 3.75), never NaN, never zero
    key_scale = g.integers(0x28, 0x48, size=(P, E, D // 16), dtype=cp.uint8)
    key_gscale = (cp.exp2(g.uniform(-12, -4, size=P)).astype(cp.float32))
    q = g.standard_normal((T, H, D), dtype=cp.float32)
    w = g.standard_normal((T, H), dtype=cp.float32)
    arrays_ = dict(q=q, w=w, keys_fp4=keys_fp4, key_scale=key_scale, key_gscale=key_gscale,
                   block_table=cp.asarray(lay["block_table"]), valid_lens=cp.asarray(lay["valid_lens"]))
    if lay["cu_seqlens"] is not None:
        arrays_["cu_seqlens"] = cp.asarray(lay["cu_seqlens"])
    return arrays_, lay["counts"]


def input_sets(case: Case, cp, index: int):  # gpu-only
    """The rotated input sets of the ``index``-th case run, and the first set's counts."""
    a, counts = build(case, cp, seed=100 + index)
    sets = [a]
    one = sum(x.nbytes for x in a.values())
    for r in range(1, rotation_sets(one)):
        sets.append(build(case, cp, seed=1000 * r + index)[0])
    return sets, counts


def time_it(cp, fn, sets, warmup=3, repeats=20, max_seconds=20.0):  # gpu-only
    """Median milliseconds of fn(inputs) with CUDA events, rotating over the input sets."""
    for i in range(warmup):
        fn(sets[i % len(sets)])
    cp.cuda.Device().synchronize()
    times = []
    t_end = time.perf_counter() + max_seconds
    for i in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn(sets[i % len(sets)])
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
        if time.perf_counter() > t_end and len(times) >= 3:
            break
    return statistics.median(times)


#: cycles the busy kernel runs before each timed graph replay: ~200 us, far longer than the
#: host takes to enqueue the start event, the graph and the stop event behind it
BUSY_CYCLES = 400_000


def busy(cp, stream, cycles: int = BUSY_CYCLES):  # gpu-only
    """Keep every SM of the current device busy for ``cycles`` on ``stream``
    (kernels/bench_probes.cu), so that what is enqueued next waits behind it."""
    from . import _jit, cuda_ops  # noqa: PLC0415

    kern = _jit.get_kernel("bench_probes.cu", "busy_kernel")
    sms = cuda_ops.device_facts(cp.cuda.Device().id).sm_count  # cached: looked up once a device
    with stream:
        kern((4 * sms,), (128,), (cp.int64(cycles),))


def time_graph(cp, fn, sets, repeats=20, echo=print):  # gpu-only
    """Median milliseconds of CUDA-graph replays of fn (one graph per input set): the
    device time without the host's launch overhead, as an engine running decode steps in
    graphs sees it. None if capture fails.

    Each replay is timed alone, its start event, graph and stop event enqueued behind a
    kernel that keeps every SM busy (``busy``): the GPU reaches them only after the host has
    submitted all three, so the interval holds the graph's own launch on the device, its
    kernels and the gaps between them, and not the host's submission (timed from an idle
    GPU, an empty graph's median held 0.6-1.8 us of it, decode-latency's 0.2-0.4 us:
    docs/performance.md, v37)."""
    stream = cp.cuda.Stream(non_blocking=True)
    graphs = []
    try:
        with stream:
            for x in sets:
                fn(x)  # warm: the memory pool now holds blocks of every size the call takes
                stream.synchronize()
                stream.begin_capture()
                fn(x)
                graphs.append(stream.end_capture())
    except Exception as exc:  # capture unsupported for this path: report eager time only
        echo(f"  (graph capture failed: {type(exc).__name__}: {exc})")
        return None
    for g in graphs:
        g.launch(stream)
    busy(cp, stream)  # compiled and loaded before the timed replays
    stream.synchronize()
    times = []
    for i in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        busy(cp, stream)
        start.record(stream)
        graphs[i % len(graphs)].launch(stream)
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def ceilings(cp):  # gpu-only
    """Copy bandwidth (bytes read + written per second) and dense fp16 tensor rate, measured now."""
    n = 1 << 30
    a = cp.random.default_rng(1).integers(0, 255, size=n, dtype=cp.uint8)
    b = cp.empty_like(a)
    ms = time_it(cp, lambda _: cp.copyto(b, a), [None], warmup=3, repeats=10)
    bw = 2 * n / (ms * 1e-3)
    a = b = None  # the 2 GB of copy buffers freed before the GEMM's operands
    x, y = gemm_operands(cp)
    ms = time_it(cp, lambda _: cp.matmul(x, y), [None], warmup=3, repeats=10)
    rate = 2 * x.shape[0] ** 3 / (ms * 1e-3)
    return bw, rate


def gemm_operands(cp, m: int = 8192):  # gpu-only
    """The two random fp16 (m, m) matrices whose product measures the tensor rate."""
    x = cp.random.default_rng(2).standard_normal((m, m), dtype=cp.float32).astype(cp.float16)
    y = cp.random.default_rng(3).standard_normal((m, m), dtype=cp.float32).astype(cp.float16)
    return x, y


def device_name(cp) -> str:  # gpu-only
    """The current CUDA device's name."""
    return cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()


def torch_composed_fn(torch, top_k, E, chunk_bytes=4 << 30):  # gpu-only
    """What a PyTorch user writes: dequantize the pool, gather by block table, bf16 einsum,
    ReLU, weighted head sum, torch.topk; queries chunked so it fits."""
    lut = torch.tensor(nvfp4.E2M1_VALUES, device="cuda")

    def run(a):
        codes, scales, gs = a["keys_fp4"], a["key_scale"], a["key_gscale"]
        P, Ee, half = codes.shape
        el = torch.stack([lut[(codes & 0xF).long()], lut[(codes >> 4).long()]], dim=-1).reshape(P, Ee, 2 * half)
        sc = scales.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=-1)
        pool = (el * sc * gs[:, None, None]).to(torch.bfloat16)
        q, w, bt, lens = a["q"], a["w"], a["block_table"], a["valid_lens"]
        T, L = bt.shape
        S = L * Ee
        per_query = S * (D * 2 + H * 2 + 8)
        step = max(1, chunk_bytes // per_query)
        outs = []
        for t0 in range(0, T, step):
            t1 = min(T, t0 + step)
            keys = pool[bt[t0:t1].clamp(min=0).long()].reshape(t1 - t0, S, D)
            logits = torch.einsum("thd,tsd->ths", q[t0:t1].to(torch.bfloat16), keys)
            scores = torch.einsum("th,ths->ts", w[t0:t1], torch.relu(logits).float())
            mask = torch.arange(S, device="cuda")[None, :] >= lens[t0:t1, None]
            scores = scores.masked_fill(mask, float("-inf"))
            outs.append(torch.topk(scores, min(top_k, S), dim=1).indices)
        return torch.cat(outs)

    return run


def float8_query(torch, q):  # gpu-only
    """CuPy float32 query ``q`` as a PyTorch float8_e4m3fn tensor on q's device (PyTorch's
    cast: round to nearest; the bench's standard normal queries lie far inside its +-448):
    the bench's FP8 query."""
    return torch.from_dlpack(q).to(torch.float8_e4m3fn)


def torch_on_cupy_stream(torch, cp):  # gpu-only
    """A context making PyTorch's current stream CuPy's current one, so that a call with a
    PyTorch tensor among its inputs (which runs on PyTorch's current stream) runs where the
    bench times and captures: CuPy's stream. Nothing to do where the two are one."""
    ptr = cp.cuda.get_current_stream().ptr
    if ptr == torch.cuda.current_stream().cuda_stream:
        return contextlib.nullcontext()
    held = _TORCH_STREAMS.get(ptr)
    if held is None:
        held = _TORCH_STREAMS[ptr] = torch.cuda.ExternalStream(ptr)
    return torch.cuda.stream(held)


_TORCH_STREAMS = {}  # CuPy stream pointer -> the torch.cuda.ExternalStream over it


def call_case(cuda_ops, x, top_k, **kwargs):  # gpu-only
    """One ``cuda_ops.score_topk`` call on input set ``x`` (as ``input_sets`` builds it),
    grouped by its ``cu_seqlens`` where the case has them; ``kwargs`` go to the call."""
    return cuda_ops.score_topk(x["q"], x["w"], x["keys_fp4"], x["key_scale"], x["key_gscale"], x["block_table"],
                               x["valid_lens"], top_k, _cu_seqlens=x.get("cu_seqlens"), **kwargs)


def measure(path, case, counts, sets, mods, repeats, echo=print):  # gpu-only
    """(median ms or None when the path does not run here, extra device MB, graph ms or None)."""
    cp, cuda_ops, torch = mods
    ms, extra, graph_ms = None, 0.0, None
    if path in KERNEL_PATHS:
        # one workspace a path, as an engine replaying decode steps from graphs holds one:
        # scratch memory that stays its own, and the select's counters zero at rest
        ws = Workspace()
        if "-f16" in path:  # the query as a model may give it: float16, read by the kernels where it lies
            sets = [dict(x, q=x["q"].astype(cp.float16)) for x in sets]
        on_stream = contextlib.nullcontext
        if "-f8" in path:  # DeepSeek's FP8 query form: float8_e4m3fn, which CuPy lacks (a PyTorch tensor)
            if torch is None:
                echo(f"  ({path} needs PyTorch for its float8_e4m3fn query)")
                return None, 0.0, None
            sets = [dict(x, q=float8_query(torch, x["q"])) for x in sets]
            on_stream = functools.partial(torch_on_cupy_stream, torch, cp)

        def fn(x, _p=path.split("-")[0], _only=path.endswith("-score"),
               _k="mma" if "-mma" in path else "wgmma-single" if "-single" in path else "ws" if "-ws" in path
               else "wgmma" if "-wgmma" in path else "ks" if "-ks" in path else "dense" if "-dense" in path
               else "auto"):
            # fast-single: rows of a sequence scored one by one (no shared key tiles); fast-f16:
            # the default kernels on a float16 query; fast-ws,
            # fast-wgmma, fast-ks, fast-dense: that scoring kernel forced
            with on_stream():  # (fast-f8: the call's tensor would take PyTorch's stream otherwise)
                return call_case(cuda_ops, x, case.top_k, precision=_p, validate=False, _score_only=_only,
                                 _fast_kernel=_k, workspace=ws)
        # extra device memory: everything one call allocates beyond its output
        pool = cp.cuda.MemoryPool()
        try:
            with cp.cuda.using_allocator(pool.malloc):
                fn(sets[0])
                cp.cuda.Device().synchronize()
        except ValueError as exc:  # a forced kernel that does not take this case's shape
            echo(f"  ({path} does not run {case.name}: {exc})")
            return None, 0.0, None
        extra = (pool.total_bytes() - counts["T"] * case.top_k * 4) / 2**20
        del pool
        ms = time_it(cp, fn, sets, repeats=repeats)
        graph_ms = time_graph(cp, fn, sets, repeats=repeats, echo=echo)
    elif path == "prepared":
        ms, extra = _measure_prepared(case, counts, sets, cp, repeats)
    elif path == "torch-composed" and torch is not None:
        run_ = torch_composed_fn(torch, case.top_k, case.E)
        tsets = [{k: torch.from_dlpack(v) for k, v in s.items()} for s in sets]
        ms = time_it(cp, run_, tsets, warmup=1, repeats=min(repeats, 5), max_seconds=10)
    elif path == "torch-topk" and torch is not None:
        S = counts["L"] * case.E
        sc = torch.randn(counts["T"], S, device="cuda")
        ms = time_it(cp, lambda _: torch.topk(sc, case.top_k, dim=1), [None], repeats=repeats)
        del sc
    return ms, extra, graph_ms


def _measure_prepared(case, counts, sets, cp, repeats):  # gpu-only
    """(median ms, extra MB) of a prepared call (``indexer.prepare`` on the first set's
    shapes, its own workspace, ``out=``) timed eagerly over the input sets, each set called
    twice first (so that every set's graph is captured before the timed calls)."""
    from .prepared import prepare  # noqa: PLC0415

    def per_sequence(x):  # the grouped calls' (B, L) table: a sequence's rows share its row
        return x["block_table"] if "cu_seqlens" not in x else cp.ascontiguousarray(
            x["block_table"][x["cu_seqlens"][:-1]])

    x0 = sets[0]
    grouped = "cu_seqlens" in x0
    keys = ("q", "w", "keys_fp4", "key_scale", "key_gscale")
    tables = [per_sequence(x) for x in sets]
    step = prepare(*(x0[k] for k in keys), tables[0], x0["valid_lens"], case.top_k, validate=False,
                   cu_seqlens_q=x0.get("cu_seqlens"))
    out = cp.empty((counts["T"], case.top_k), dtype=cp.int32)
    table_of = {id(x): t for x, t in zip(sets, tables)}

    def fn(x):
        extra_args = {"cu_seqlens_q": x["cu_seqlens"]} if grouped else {}
        return step(*(x[k] for k in keys), table_of[id(x)], x["valid_lens"], out=out, **extra_args)

    pool = cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc):
        fn(sets[0])
        cp.cuda.Device().synchronize()
    extra = pool.total_bytes() / 2**20
    for x in sets:
        fn(x)
    ms = time_it(cp, fn, sets, repeats=repeats)
    del pool
    return ms, extra


def free_device_memory(cp) -> None:  # gpu-only
    """Give the cached blocks of CuPy's default pool back, between cases."""
    cp.get_default_memory_pool().free_all_blocks()


# ----------------------------------------------------------------------------- the run


def _print_line(line: str) -> None:
    print(line, flush=True)


def run(cases, paths, repeats: int = 20, json_path=None, progress=None, echo=None) -> dict:
    """Measure ``cases`` x ``paths`` on the GPU, print the table, return the results.

    ``cases``: Case objects or case names; ``paths``: path names (see PATHS; a path whose
    library is missing, e.g. torch-* without PyTorch, or an unknown one, gives no row).
    ``progress(case_name, path)`` is called after each measured pair; ``echo(line)``
    prints a line (default: print, flushed). ``json_path`` gets the results as JSON:
    {device, date, copy_bw, tensor_rate, cases: [{case, floor_ms, T, pairs, bytes, flops,
    P, L, paths: {path: {ms, x_floor, tflops, gbs, extra_mb, vs_torch}}}]}, kernel paths
    also as "path (graph)" (CUDA-graph replay). Raises GPUUnavailable (a RuntimeError)
    without CuPy and a CUDA GPU.
    """
    echo = echo or _print_line
    cases = [case_named(c, "cases") or c if isinstance(c, str) else c for c in cases]
    unknown = [c for c in cases if isinstance(c, str)]
    if unknown:
        raise ValueError(f"cases: unknown case {', '.join(map(repr, unknown))} (known: "
                         f"{', '.join(c.name for c in CASES)}, or a case of your own: {CUSTOM_CASE_FORM})")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"repeats: expected an int in [1, {MAX_REPEATS}], got {repeats!r}")
    if json_path is not None:
        io.check_writable(json_path, in_place=True)  # before the measurements; written where it is
    require_gpu()
    mods = _gpu_modules()
    cp = mods[0]
    bw, rate = ceilings(cp)
    dev_name = device_name(cp)
    echo(f"# {dev_name}  {time.strftime('%Y-%m-%d %H:%M')}  copy {bw / 1e12:.2f} TB/s  "
         f"fp16 tensor {rate / 1e12:.0f} TFLOP/s")
    width = max([CASE_WIDTH] + [len(c.name) for c in cases])
    echo(header(width))
    results = dict(device=dev_name, date=time.strftime("%Y-%m-%d"), copy_bw=bw, tensor_rate=rate, cases=[])
    for ci, case in enumerate(cases):
        sets, counts = input_sets(case, cp, ci)
        floor_s = floor_seconds(counts, bw, rate)
        row = dict(case=case.name, floor_ms=floor_s * 1e3, **counts, paths={})
        torch_ms = None
        for path in paths:
            ms, extra, graph_ms = measure(path, case, counts, sets, mods, repeats, echo=echo)
            if progress is not None:
                progress(case.name, path)
            if ms is None:
                continue
            if path == "torch-composed":
                torch_ms = ms
            row["paths"][path] = path_numbers(ms, extra, counts, floor_s)
            if graph_ms is not None:
                row["paths"][path + " (graph)"] = path_numbers(graph_ms, extra, counts, floor_s)
        for path, line in row["paths"].items():
            line["vs_torch"] = torch_ms / line["ms"] if torch_ms else None
            echo(format_line(case.name, path, line, torch_ms, width))
        echo(f"{case.name:{width}s} {'floor':20s} {row['floor_ms']:9.4f}")
        results["cases"].append(row)
        del sets
        free_device_memory(cp)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))
    return results


def main(argv=None) -> int:
    """``scripts/bench.py``'s command line; returns the exit status (2 without a GPU)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=DEFAULT_CASES,
                    help=f"comma list, or 'all' (known: {', '.join(c.name for c in CASES)}; or your own: {CUSTOM_CASE_FORM})")
    ap.add_argument("--paths", default=DEFAULT_PATHS)
    ap.add_argument("--repeats", type=int, default=20, help=f"timed calls per path, 1 to {MAX_REPEATS}")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args(argv)
    try:
        require_gpu()
    except GPUUnavailable as exc:
        print(exc)
        return 2
    try:
        run(select_cases(args.cases, strict=False), args.paths.split(","), args.repeats, json_path=args.json_path)
    except (ValueError, OSError) as exc:  # a bad --repeats or --json, said before any measurement
        print(f"error: {exc}")
        return 2
    return 0
