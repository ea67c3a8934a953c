#!/usr/bin/env python3
"""Compile every kernel instance with NVRTC for a target architecture, no GPU needed.

This is the compile that ``indexer._jit`` asks CuPy for at run time (same sources with
includes inlined, same name expressions, same options), done here through NVRTC's C API
with ctypes, so CI catches a kernel that does not compile on a machine without a GPU.

    python scripts/compile_kernels.py                 # sm_90a, every instance
    python scripts/compile_kernels.py --arch sm_80 -v # another target, print resource use
    python scripts/compile_kernels.py --only score_wgmma_kernel --define INDEXER_TIMELINE  # a probe build

With every instance (no --only), the shared-memory layouts are checked too: the sizes
indexer.geometry computes for the launches, asserted at compile time against the kernels'
own layout structs (a size short of the kernel's layout would let it write past its shared
memory; nothing at run time checks).

libnvrtc is taken from $INDEXER_NVRTC, the ``nvidia-cuda-nvrtc`` wheel, CuPy's CUDA path or
/usr/local/cuda. Exit status 1 if any instance fails, with NVRTC's log.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer import _jit, geometry  # noqa: E402


def layout_checks() -> dict[str, list[str]]:
    """{source: [C++ constant expressions that must hold]}: each launch's shared-memory size
    (indexer.geometry) against the kernel's layout struct, and the query images' sizes."""
    dims = (32, 64, 96, 128)
    return {
        "score_wgmma.cu": [f"WgmmaSmem<{d}>::kBytes == {geometry.wgmma_smem_bytes(d)}" for d in dims]
        + [f"WgmmaPairSmem<{d}>::kBytes == {geometry.wgmma_pairs_smem_bytes(d)}" for d in dims]
        + [f"PrepToWgmmaImage<{d}>::kBytes == {geometry.wgmma_query_image_bytes(d)}" for d in dims],
        "score_ks.cu": [f"KsSmem<128>::kBytes == {geometry.ks_smem_bytes(128)}",
                        f"KsSmem<128>::kQImage == {geometry.KS_QUERY_BYTES}"],
        "score_dense.cu": [f"DenseSmem::kBytes == {geometry.dense_smem_bytes(128)}"],
        "score_ws.cu": [f"WsSmem::kBytes == {geometry.ws_smem_bytes(128)}"],
        "score_fp32.cu": [f"Fp32Smem<{g}>::bytes({d}) == {geometry.fp32_smem_bytes(d, g)}"
                          for g in (1, 2, 4, 8, 16) for d in (16, 128, 256)],
        "score_mma.cu": [f"MmaSmem<{d}, {b}>::kBytes == {geometry.mma_smem_bytes(d, b)}"
                         for b in (2, 4, 8, 16) for d in (32, 128, 256)],
    }


def find_nvrtc() -> str:
    asked = os.environ.get("INDEXER_NVRTC")
    if asked:  # exactly this one (CI checks a given NVRTC version: no quiet fallback to another)
        if not os.path.isfile(asked):
            raise SystemExit(f"INDEXER_NVRTC: no such file: {asked}")
        return asked
    candidates = []
    try:
        import nvidia  # the nvidia-cuda-nvrtc wheel  # noqa: PLC0415

        for base in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(base, "*", "lib", "libnvrtc.so*")))
            candidates += sorted(glob.glob(os.path.join(base, "cuda_nvrtc", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    for root in (os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")))
    try:  # last: the one this process has loaded already (CuPy's, once it compiled a kernel)
        with open("/proc/self/maps") as maps:
            candidates += sorted({line.split()[-1] for line in maps if "/libnvrtc.so" in line})
    except OSError:
        pass
    for c in candidates:
        if "alt" in os.path.basename(c) or "builtins" in os.path.basename(c):
            continue
        if os.path.isfile(c):
            return c
    raise SystemExit("libnvrtc not found: pip install 'nvidia-cuda-nvrtc==13.0.*' or set INDEXER_NVRTC")


class Nvrtc:
    def __init__(self, path: str):
        # NVRTC dlopens its builtins library by name: load it first from the same folder
        for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
            if ".alt." not in builtins:
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                break
        self.lib = ctypes.CDLL(path)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(status).decode()}")

    def version(self):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return major.value, minor.value

    @contextlib.contextmanager
    def _program(self, source: str, name: str, name_expression, options):
        """A compiled NVRTC program of ``source`` with ``name_expression`` added (None: none):
        yields (program, ok, log), destroyed on exit."""
        prog = ctypes.c_void_p()
        self.check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
                   "nvrtcCreateProgram")
        try:
            if name_expression is not None:  # None: a compile for its static assertions alone
                self.check(self.lib.nvrtcAddNameExpression(prog, name_expression.encode()), "nvrtcAddNameExpression")
            opts = [o.encode() for o in options]
            status = self.lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, buf)
            yield prog, status == 0, buf.value.decode(errors="replace").strip()
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def compile(self, source: str, name: str, name_expression: str, options, cubin_path=None) -> tuple[bool, str, int]:
        """Compile to CUBIN (written to ``cubin_path`` if given); returns (ok, log, cubin size)."""
        with self._program(source, name, name_expression, options) as (prog, ok, log):
            if not ok:
                return False, log, 0
            cubin_size = ctypes.c_size_t()
            self.check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(cubin_size)), "nvrtcGetCUBINSize")
            if cubin_path:
                cubin = ctypes.create_string_buffer(cubin_size.value)
                self.check(self.lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
                Path(cubin_path).write_bytes(cubin.raw)
            return True, log, cubin_size.value

    def ptx(self, source: str, name: str, name_expression: str, options) -> tuple[str, str]:
        """Compile to PTX (for a virtual target such as ``-arch=compute_80``): (the PTX, the
        instance's lowered name). RuntimeError with NVRTC's log if it does not compile."""
        with self._program(source, name, name_expression, options) as (prog, ok, log):
            if not ok:
                raise RuntimeError(f"{name_expression}: {log}")
            size = ctypes.c_size_t()
            self.check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
            text = ctypes.create_string_buffer(size.value)
            self.check(self.lib.nvrtcGetPTX(prog, text), "nvrtcGetPTX")
            lowered = ctypes.c_char_p()
            self.check(self.lib.nvrtcGetLoweredName(prog, name_expression.encode(), ctypes.byref(lowered)),
                       "nvrtcGetLoweredName")
            return text.value.decode(), lowered.value.decode()


def nvrtc_options(arch: str) -> list[str]:
    """NVRTC options for target ``arch`` (e.g. sm_90a): the run-time compile's options
    (indexer._jit.compile_options) with that target, and the ``-ftz=true`` that CuPy's
    RawModule appends to every NVRTC compile (cupy/cuda/compiler.py), so that the machine
    code built here is the code that runs."""
    cc = int(arch[3:5])
    return [o for o in _jit.compile_options(cc) if not o.startswith("-arch=")] + [f"-arch={arch}", "-ftz=true"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90a", help="NVRTC target, e.g. sm_90a, sm_80")
    ap.add_argument("-v", "--verbose", action="store_true", help="print NVRTC's log (ptxas resource use)")
    ap.add_argument("--only", default=None, help="compile only name expressions containing this text")
    ap.add_argument("--cubin-dir", default=None, help="write each CUBIN there (for cuobjdump -sass)")
    ap.add_argument("--define", action="append", default=[], metavar="NAME",
                    help="compile with NAME defined (repeatable), e.g. INDEXER_TIMELINE: the build of "
                         "scripts/probe_timeline.py")
    args = ap.parse_args(argv)
    defines = "".join(f"#define {name} 1\n" for name in args.define)
    nvrtc = Nvrtc(find_nvrtc())
    options = nvrtc_options(args.arch)
    if args.verbose:
        options.append("-Xptxas=-v")
    print(f"NVRTC {'.'.join(map(str, nvrtc.version()))}, options {' '.join(options)}")
    failures = 0
    todo = [(s, n) for s, n in _jit.instances() if args.only is None or args.only in n]
    for source, name_expression in todo:
        t0 = time.perf_counter()
        cubin = None
        if args.cubin_dir:
            Path(args.cubin_dir).mkdir(parents=True, exist_ok=True)
            cubin = Path(args.cubin_dir) / (re.sub(r"[^A-Za-z0-9]+", "_", name_expression).strip("_") + ".cubin")
        ok, log, size = nvrtc.compile(defines + _jit.read_source(source), source, name_expression, options, cubin)
        status = "ok  " if ok else "FAIL"
        print(f"{status} {source:18s} {name_expression:40s} {size:8d} B  {time.perf_counter() - t0:5.1f} s")
        if log and (args.verbose or not ok):
            print("    " + log.replace("\n", "\n    "))
        failures += not ok
    print(f"{len(todo) - failures} compiled, {failures} failed")
    if args.only is None:  # every instance: the layouts too
        for source, conditions in layout_checks().items():
            text = _jit.read_source(source) + "".join(f'\nstatic_assert({c}, "{c}");' for c in conditions)
            ok, log, _ = nvrtc.compile(text, source, None, options)
            print(f"{'ok  ' if ok else 'FAIL'} {source:18s} layout: {len(conditions)} sizes as geometry.py's")
            if not ok:
                print("    " + log.replace("\n", "\n    "))
            failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
