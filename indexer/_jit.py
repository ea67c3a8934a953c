"""Run-time compilation of the CUDA sources in ``kernels/`` through CuPy's ``RawModule``.

* Sources are read from one folder, ``kernel_dir()``: ``indexer/kernels`` in an installed
  wheel, ``<repo>/kernels`` in a source checkout.
* Local ``#include "x.cuh"`` lines are inlined, and a hash of every file in the folder is
  stamped into the source: CuPy's disk cache key covers the source string and options but
  not included files, so an edited header would otherwise reuse a stale binary.
* Each kernel template instance is compiled on first use into its own module (one module
  per source, name expression, options and device), cached in process; CuPy's disk cache
  (``cache_dir()``) spares later processes the compile.
* ``INSTANCES`` is the table of every template instance a launch may ask for; CI compiles
  all of them for sm_90a without a GPU (``scripts/compile_kernels.py``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
from pathlib import Path

__all__ = ["kernel_dir", "cache_dir", "read_source", "source_versions", "kernels_hash", "arch_for",
           "compile_options", "INSTANCES", "instances", "get_kernel"]

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$", re.MULTILINE)


def kernel_dir() -> Path:
    """The folder holding the ``.cu``/``.cuh`` sources."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(f"CUDA sources not found next to {here} (looked for kernels/common.cuh)")


def cache_dir() -> Path:
    """CuPy's on-disk kernel cache folder (``CUPY_CACHE_DIR`` or ``~/.cupy/kernel_cache``)."""
    return Path(os.environ.get("CUPY_CACHE_DIR", Path.home() / ".cupy" / "kernel_cache"))


@functools.cache
def kernels_hash() -> str:
    """sha256 over the names and contents of every source file in ``kernel_dir()``."""
    h = hashlib.sha256()
    for path in sorted(kernel_dir().glob("*.cu*")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _inline(path: Path, seen: set) -> str:
    text = _PRAGMA_ONCE.sub("", path.read_text())

    def include(match):
        target = path.parent / match.group(1)
        if not target.is_file():
            return match.group(0)  # not ours: leave it for NVRTC (e.g. a built-in header)
        if target in seen:
            return ""
        seen.add(target)
        return f"// ---- begin {target.name}\n{_inline(target, seen)}\n// ---- end {target.name}\n"

    return _INCLUDE.sub(include, text)


@functools.cache
def read_source(name: str) -> str:
    """The source of ``kernels/<name>`` with local includes inlined and the folder hash stamped."""
    path = kernel_dir() / name
    return f"// indexer kernels {kernels_hash()}\n" + _inline(path, {path})


@contextlib.contextmanager
def source_versions(texts: dict, like: str):
    """Other versions of a kernel source, compiled under names of their own while the block runs.

    texts: {tag: source text} (as ``read_source`` gives one: includes inlined); each tag
    compiles with the template instances of the source file ``like``. Inside the block
    ``read_source(tag)`` gives its text and ``INSTANCES[tag]`` lists ``like``'s instances, so
    that a launch told to take ``tag`` for ``like`` (``cuda_ops._SCORING_SOURCES``) builds
    that version; afterwards both are as before. For one-process A/Bs and probe builds
    (scripts/ab_kernels.py, scripts/probe_timeline.py)."""
    global read_source
    original = read_source
    added = [tag for tag in texts if tag not in INSTANCES]
    read_source = lambda name: texts[name] if name in texts else original(name)  # noqa: E731
    for tag in added:
        INSTANCES[tag] = INSTANCES[like]
    try:
        yield
    finally:
        read_source = original
        for tag in added:
            del INSTANCES[tag]


def arch_for(compute_capability: int) -> str:
    """The NVRTC target: ``sm_90a`` on Hopper (wgmma, setmaxnreg), else ``sm_XY``."""
    return "sm_90a" if compute_capability == 90 else f"sm_{compute_capability}"


def compile_options(compute_capability: int) -> tuple:
    return ("-std=c++17", f"-arch={arch_for(compute_capability)}")


#: the query's element type by dtype name: the kernels' template argument (kernels/common.cuh)
QUERY_ELEMENTS = {"float32": "float", "float16": "half_bits", "bfloat16": "bf16_bits", "float8_e4m3fn": "e4m3_bits"}
#: the template arguments each q-reading kernel takes before its query's element type
_QUERY_TEMPLATE_ARITY = {"score_fp32_kernel": 1, "prep_query_kernel": 2, "wgmma_prep_kernel": 1,
                         "score_wgmma_pairs_kernel": 2, "score_ws_kernel": 1, "ks_prep_kernel": 1,
                         "score_dense_kernel": 1}


def query_instance(name: str, query_dtype: str) -> str:
    """``name`` (every template argument written out) for a query of ``query_dtype`` (a
    ``QUERY_ELEMENTS`` key): float32 keeps the name (the default argument, float); the
    narrower types append their element type as the last template argument."""
    if query_dtype == "float32":
        return name
    # the element type is the last template parameter: a name that leaves a defaulted
    # argument before it out would put the type in that argument's place
    kernel = name.split("<")[0]
    if kernel not in _QUERY_TEMPLATE_ARITY or name.count(",") + 1 != _QUERY_TEMPLATE_ARITY[kernel]:
        raise ValueError(f"{name}: not a q-reading kernel with every template argument before the "
                         f"query's element type written out")
    return f"{name[:-1]}, {QUERY_ELEMENTS[query_dtype]}>"


def _typed(names):
    """``names`` for every query element type (the instances of kernels that read q)."""
    return [query_instance(n, dt) for n in names for dt in QUERY_ELEMENTS]


def _heads_instances():
    return _typed([f"score_fp32_kernel<{hg}>" for hg in (1, 2, 4, 8, 16)])


def _mma_instances():
    shapes = [(d, nb) for d in range(32, 257, 32) for nb in (2, 4, 8, 16)]
    return [f"score_mma_kernel<{d}, {nb}>" for d, nb in shapes] + _typed(
        [f"prep_query_kernel<{d}, {nb}>" for d, nb in shapes])


#: every template instance, by source file: the table launches and CI draw from
INSTANCES = {
    "score_fp32.cu": _heads_instances(),
    "score_mma.cu": _mma_instances(),
    # score_wgmma_kernel<d> and score_wgmma_pairs_kernel<d> take wgmma_prep_kernel<d>'s query
    # images; <d, true> prep_query_kernel's rows and the query itself (A/Bs); the narrower
    # queries' instances write every template argument out
    "score_wgmma.cu": [f"{k}<{d}{a}>" for d in (32, 64, 96, 128) for k in ("score_wgmma_kernel", "score_wgmma_pairs_kernel")
                       for a in ("", ", true")]
    + _typed([f"wgmma_prep_kernel<{d}>" for d in (32, 64, 96, 128)])
    + [query_instance(f"score_wgmma_pairs_kernel<{d}, true>", dt) for d in (32, 64, 96, 128)
       for dt in list(QUERY_ELEMENTS)[1:]]
    # a split pair call's two halves (score_wgmma_pairs::kSharedUnits, kLoneRows), on the images
    + [f"score_wgmma_pairs_kernel<{d}, false, float, {units}>" for d in (32, 64, 96, 128) for units in (1, 2)],
    "score_ws.cu": _typed(["score_ws_kernel<128>"]),
    "score_ks.cu": ["score_ks_kernel<128>"] + _typed(["ks_prep_kernel<128>"]),
    "score_dense.cu": _typed(["score_dense_kernel<128>"]) + ["dense_keys_kernel<128>"],
    "probe_wgmma.cu": ["wgmma_rate_kernel<128>"] + [f"wgmma_overlap_kernel<{m}>" for m in range(7)] + [
        f"wgmma_tile_kernel<{s}>" for s in (1, 2, 3)],  # scripts/probe_ceiling.py only
    "check_values.cu": ["check_values_kernel"],
    # KeyPool's writes on the GPU, and indexer.write_keys (its writes, its checks) by slot and key element type
    "key_write.cu": ["key_write_kernel"] + [f"{kernel}<{s}, {k}>" for kernel in ("key_write_slots_kernel", "key_check_kernel")
                                            for s in ("int", "long long") for k in ("float", "half_bits", "bf16_bits")],
    "ragged.cu": ["expand_block_table_kernel"],
    "bench_probes.cu": ["busy_kernel", "read_stream_kernel"],  # bench.py, scripts/sustained_rate.py
    "select_fast.cu": ["topk_histogram_kernel<256, 16>", "topk_histogram_kernel<256, 4>",
                       "topk_filter_kernel<256, 16>", "topk_filter_kernel<256, 4>",
                       "topk_sample_kernel<256>", "topk_filter_kernel<256, 16, true>", "topk_filter_kernel<256, 4, true>",
                       "topk_final_kernel<1024, 8192, true>",
                       "topk_rank_kernel<256, false>", "topk_rank_kernel<256, true>", "topk_final_kernel<1024, 8192>",
                       "topk_row_stream_kernel<1024>",
                       "topk_row_kernel<256, 4096, 16>", "topk_row_kernel<256, 4096, 0>",
                       "topk_row_kernel<128, 1024, 16>", "topk_row_kernel<128, 512, 16>", "block_sort_kernel<1024>", "block_sort_kernel<256>", "block_sort_kernel<128>"],
}


def instances():
    """(source, name expression) for every instance in ``INSTANCES``."""
    return [(src, name) for src, names in INSTANCES.items() for name in names]


@functools.cache
def _module(source: str, name_expression: str, device_id: int, compute_capability: int):  # gpu-only
    import cupy as cp  # noqa: PLC0415  (GPU path only)

    with cp.cuda.Device(device_id):
        return cp.RawModule(code=read_source(source), options=compile_options(compute_capability),
                            name_expressions=(name_expression,))


@functools.cache
def _kernel(source: str, name_expression: str, device_id: int):  # gpu-only
    import cupy as cp  # noqa: PLC0415

    if name_expression not in INSTANCES.get(source, ()):
        raise KeyError(f"{name_expression} is not in the instance table of {source}")
    cc = int(cp.cuda.Device(device_id).compute_capability)
    return _module(source, name_expression, device_id, cc).get_function(name_expression)


def get_kernel(source: str, name_expression: str, device_id: int | None = None):  # gpu-only
    """The compiled ``RawKernel`` for ``name_expression`` of ``kernels/<source>`` on a device
    (the current CuPy device by default)."""
    import cupy as cp  # noqa: PLC0415

    if device_id is None:
        device_id = cp.cuda.Device().id
    return _kernel(source, name_expression, int(device_id))
