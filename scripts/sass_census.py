#!/usr/bin/env python3
"""Count a kernel's SASS instructions in its loops, by opcode and by the pipe that runs
them, with no GPU: what one change does to a hot loop before the device measures it.

    python scripts/sass_census.py 'score_wgmma_kernel<128>'
    python scripts/sass_census.py 'score_wgmma_kernel<128>' --against HEAD        # this tree against a revision
    python scripts/sass_census.py 'score_wgmma_pairs_kernel<128>' --against my_copy.cu --loop 1

The kernel is compiled as compile_kernels.py compiles it (NVRTC, the run-time options);
``--against`` takes a git revision or a file holding another version of the kernel's
source, as scripts/ab_kernels.py does, and prints the two side by side. A loop is the
address range of a backward branch; the census counts the instructions written there
(static counts: code that only some threads run, such as the ring's issuing path, counts
fully). Loops of fewer than --min instructions are left out; the one broken down is, unless
--loop names another, the smallest that holds MMA instructions (a scoring kernel's tile
loop; a warpgroup fence or wait alone, as out-of-line paths hold, does not count), else the
largest. ``--listing`` prints that loop's instructions too, or only those of one pipe
(``--listing alu``): where a change put them, without a separate cuobjdump.

    python scripts/sass_census.py 'score_wgmma_kernel<128>' --listing alu

Why by pipe: the single-query kernel's tile loop is bound by its ALU pipe (docs/performance.md
v64-v65: an ALU instruction taken out of it is worth ~0.25%, one moved to the FMA pipe
about as much), so what a change does to each pipe predicts more than its total. The
grouping follows the ncu pipe metrics as measured on the H200 (v64); opcodes it does not
know are listed as "other".

Needs libnvrtc (as compile_kernels.py) and cuobjdump: $CUOBJDUMP, the
``nvidia-cuda-cuobjdump`` wheel, PATH or /usr/local/cuda/bin.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

#: pipe of each opcode (its first dot-separated part), as the H200's ncu counts them
PIPES = {
    "alu": {"LOP3", "LOP", "SHF", "ISETP", "FSETP", "FSEL", "SEL", "PRMT", "F2FP", "FMNMX", "IMNMX", "VIMNMX",
            "PLOP3", "LEA", "IADD3", "IABS", "FLO", "POPC", "BMSK", "SGXT", "P2R", "R2P", "CSET", "FCHK"},
    "fma": {"FFMA", "FADD", "FMUL", "HFMA2", "HMUL2", "HADD2", "IMAD", "IMUL", "IDP", "VIADD"},
    "tensor": {"HGMMA", "HMMA", "IMMA", "WARPGROUP", "QGMMA", "IGMMA"},
    "memory": {"LDS", "STS", "LDG", "STG", "LDL", "STL", "LD", "ST", "ATOMS", "ATOMG", "ATOM", "RED", "LDC",
               "LDSM", "STSM", "SHFL", "REDG", "LDGDEPBAR", "LDGSTS", "UBLKCP", "UTMALDG", "UTMASTG", "MEMBAR", "CCTL"},
    "control": {"BRA", "BSSY", "BSYNC", "BAR", "SYNCS", "WARPSYNC", "EXIT", "RET", "CALL", "ELECT", "NOP",
                "DEPBAR", "ENDCOLLECTIVE", "YIELD", "BREAK", "ACQBULK", "VOTE", "VOTEU", "MATCH"},
    "conversion": {"F2F", "F2I", "I2F", "I2FP", "F2IP", "FRND", "MUFU"},
}
_PIPE_OF = {op: pipe for pipe, ops in PIPES.items() for op in ops}
_ORDER = ["alu", "fma", "tensor", "memory", "control", "conversion", "uniform", "other"]

_LISTED = 12  # loops listed by report()
_MMA_OPS = PIPES["tensor"] - {"WARPGROUP"}  # the multiplies (WARPGROUP: their fences and waits)
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def parse_sass(text: str) -> list[tuple[int, str, str]]:
    """(address, opcode, whole instruction) of each instruction of one function's SASS as
    cuobjdump -sass prints it, in order; the predicate guard (``@P0``, ``@!P1``) is not part
    of the opcode, its modifiers (``.AND``) are."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        words = m.group(2).split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        out.append((int(m.group(1), 16), op, m.group(2)))
    return out


def pipe_of(opcode: str) -> str:
    """The pipe group of an opcode: alu, fma, tensor, memory, control, conversion, uniform
    (the uniform datapath's U* opcodes and R2UR / S2UR) or other."""
    base = opcode.split(".")[0]
    if base in _PIPE_OF:
        return _PIPE_OF[base]
    if base in ("R2UR", "S2UR") or (base.startswith("U") and (base[1:] in _PIPE_OF or base[1:] in ("MOV", "LDC"))):
        return "uniform"
    return "other"


def loops(instructions: list[tuple[int, str, str]], min_size: int = 1) -> list[tuple[int, int, int]]:
    """(first address, last address, instruction count) of every backward branch's range
    (a BRA whose target lies at or before it, its own address included), largest first;
    ranges of fewer than ``min_size`` instructions are left out."""
    addrs = [a for a, _, _ in instructions]
    found = set()
    for addr, op, text in instructions:
        if not op.startswith("BRA"):
            continue
        m = re.search(r"\b0x([0-9a-f]+)\b\s*$", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target <= addr:
            count = sum(1 for a in addrs if target <= a <= addr)
            if count >= min_size:
                found.add((target, addr, count))
    return sorted(found, key=lambda r: (-r[2], r[0]))


def census(instructions, first: int, last: int) -> collections.Counter:
    """Opcode counts (first dot-separated part) of the instructions in [first, last]."""
    return collections.Counter(op.split(".")[0] for a, op, _ in instructions if first <= a <= last)


def tile_loop(instructions, found: list[tuple[int, int, int]]) -> int:
    """Index into ``found`` (loops()) of the smallest loop holding an MMA instruction, else 0."""
    with_mma = [i for i, (f, la, _) in enumerate(found) if any(op in _MMA_OPS for op in census(instructions, f, la))]
    return with_mma[-1] if with_mma else 0


def listing(instructions, first: int, last: int, pipe: str | None = None) -> list[str]:
    """The instructions in [first, last] as "0xADDR  text" lines, only ``pipe``'s if given."""
    return [f"0x{a:04x}  {text}" for a, op, text in instructions
            if first <= a <= last and (pipe is None or pipe_of(op) == pipe)]


def by_pipe(counts: collections.Counter) -> dict[str, int]:
    totals = dict.fromkeys(_ORDER, 0)
    for op, n in counts.items():
        totals[pipe_of(op)] += n
    return totals


def find_cuobjdump() -> str:
    candidates = [os.environ.get("CUOBJDUMP", ""), shutil.which("cuobjdump") or ""]
    try:
        import nvidia  # the nvidia-cuda-cuobjdump wheel  # noqa: PLC0415

        for base in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(base, "*", "bin", "cuobjdump")))
    except ImportError:
        pass
    candidates.append("/usr/local/cuda/bin/cuobjdump")
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise SystemExit("cuobjdump not found: pip install nvidia-cuda-cuobjdump or set CUOBJDUMP")


def cuobjdump_of(name_expression: str, source_text: str, source_name: str, arch: str, flag: str) -> str:
    """``cuobjdump <flag>`` of one kernel instance's cubin, compiled from ``source_text`` as
    compile_kernels.py compiles it (NVRTC, the run-time options; includes inlined)."""
    import compile_kernels  # noqa: PLC0415

    nvrtc = compile_kernels.Nvrtc(compile_kernels.find_nvrtc())
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        ok, log, _ = nvrtc.compile(source_text, source_name, name_expression, compile_kernels.nvrtc_options(arch), cubin)
        if not ok:
            raise SystemExit(f"{name_expression} ({source_name}) does not compile:\n{log}")
        return subprocess.run([find_cuobjdump(), flag, str(cubin)], capture_output=True, text=True, check=True).stdout


def compile_sass(name_expression: str, source_text: str, source_name: str, arch: str) -> str:
    """The SASS of one kernel instance compiled from ``source_text``."""
    text = cuobjdump_of(name_expression, source_text, source_name, arch, "-sass")
    return function_sass(text, name_expression.split("<")[0])


def resource_usage(name_expression: str, source_text: str, source_name: str, arch: str) -> dict[str, int]:
    """One kernel instance's resources as ``cuobjdump -res-usage`` reports them for its cubin:
    {"REG": registers a thread, "SHARED": static shared bytes, "LOCAL": spill bytes a
    thread, ...}."""
    text = cuobjdump_of(name_expression, source_text, source_name, arch, "-res-usage")
    return parse_resource_usage(text, name_expression.split("<")[0])


def parse_resource_usage(text: str, name: str) -> dict[str, int]:
    """The counts (``KEY:value``) of the function of a ``cuobjdump -res-usage`` listing whose
    mangled name is ``name``'s (``_Z<len><name>``: a template instance or a plain kernel,
    not another kernel whose name starts with it)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        header = line.strip()
        if header.startswith("Function ") and header[len("Function "):].startswith(f"_Z{len(name)}{name}"):
            return {k: int(v) for k, v in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", lines[i + 1])}
    raise ValueError(f"no function {name!r} in the resource usage listing")


def function_sass(text: str, name: str) -> str:
    """The part of a cubin's SASS listing that is the function whose (mangled) name holds
    ``name`` (a source may hold kernels that are not templates: the cubin then holds them
    all, each from address 0); the whole text where no function header names it."""
    parts = re.split(r"(?m)^\s*Function : ", text)
    for part in parts[1:]:
        if name in part.split("\n", 1)[0]:
            return part
    return text


def source_of(name_expression: str) -> str:
    """The kernel source file (under kernels/) that holds ``name_expression``."""
    from indexer import _jit  # noqa: PLC0415

    for source, name in _jit.instances():
        if name == name_expression:
            return source
    known = sorted({n.split("<")[0] for _, n in _jit.instances()})
    raise ValueError(f"kernel: {name_expression!r} is not a kernel instance (kernels: {', '.join(known)})")


def report(label: str, instructions, loop_index: int, min_size: int, show: str | None = None) -> collections.Counter:
    found = loops(instructions, min_size)
    print(f"{label}: {len(instructions)} instructions, loops (backward branches) of at least {min_size}:")
    for i, (first, last, count) in enumerate(found[:_LISTED]):
        mma = sum(n for op, n in census(instructions, first, last).items() if pipe_of(op) == "tensor")
        print(f"  [{i}] 0x{first:x}-0x{last:x}  {count:5d} instructions" + (f"  ({mma} tensor)" if mma else ""))
    if len(found) > _LISTED:
        print(f"  (+{len(found) - _LISTED} more; --loop takes any of them)")
    if not found:
        return collections.Counter()
    if loop_index is None:  # the innermost loop with MMAs in it (a scoring kernel's tile loop), else the largest
        loop_index = tile_loop(instructions, found)
    if loop_index >= len(found):
        raise SystemExit(f"--loop: {loop_index} is past the {len(found)} loops listed")
    first, last, count = found[loop_index]
    counts = census(instructions, first, last)
    pipes = by_pipe(counts)
    print(f"  loop [{loop_index}] by pipe: " + ", ".join(f"{p} {pipes[p]}" for p in _ORDER if pipes[p]))
    for pipe in _ORDER:
        ops = sorted(((n, op) for op, n in counts.items() if pipe_of(op) == pipe), reverse=True)
        if ops:
            print(f"    {pipe:10s} " + ", ".join(f"{op} {n}" for n, op in ops))
    if show:
        lines = listing(instructions, first, last, None if show == "all" else show)
        print(f"  loop [{loop_index}]'s " + ("instructions" if show == "all" else f"{show} instructions") +
              f" ({len(lines)}):")
        for line in lines:
            print("    " + line)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", help="a kernel instance as compile_kernels.py names it, e.g. 'score_wgmma_kernel<128>'")
    ap.add_argument("--against", help="a git revision or a file holding another version of the kernel's source")
    ap.add_argument("--arch", default="sm_90a", help="NVRTC target (default sm_90a)")
    ap.add_argument("--loop", type=int, default=None,
                    help="which listed loop to break down (default: the smallest holding MMAs, else the largest)")
    ap.add_argument("--min", type=int, default=50, dest="min_size", help="smallest loop listed (default 50)")
    ap.add_argument("--listing", nargs="?", const="all", choices=["all", *_ORDER], default=None,
                    help="print the loop's instructions (the working tree's), all or one pipe's")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"sm_\d{2,3}a?", args.arch):
        ap.error(f"--arch: {args.arch!r} is not a target such as sm_90a")
    if (args.loop is not None and args.loop < 0) or args.min_size < 1:
        ap.error("--loop: at least 0; --min: at least 1")
    from indexer import _jit  # noqa: PLC0415

    try:
        source = source_of(args.kernel)
    except ValueError as e:
        ap.error(str(e))
    mine = parse_sass(compile_sass(args.kernel, _jit.read_source(source), source, args.arch))
    counts = report(f"{args.kernel}, working tree", mine, args.loop, args.min_size, args.listing)
    if args.against:
        import ab_kernels  # noqa: PLC0415

        with tempfile.TemporaryDirectory() as scratch:
            try:
                text = ab_kernels.version_text(args.against, source, Path(scratch))
            except ValueError as e:
                ap.error(str(e))
        theirs = parse_sass(compile_sass(args.kernel, text, source, args.arch))
        other = report(f"{args.kernel}, {args.against}", theirs, args.loop, args.min_size)
        diff = {op: counts[op] - other[op] for op in set(counts) | set(other) if counts[op] != other[op]}
        if diff:
            print("  working tree minus " + args.against + ": " +
                  ", ".join(f"{op} {d:+d}" for op, d in sorted(diff.items(), key=lambda kv: (pipe_of(kv[0]), kv[0]))))
            pipes_mine, pipes_other = by_pipe(counts), by_pipe(other)
            print("  by pipe: " + ", ".join(f"{p} {pipes_mine[p] - pipes_other[p]:+d}" for p in _ORDER
                                              if pipes_mine[p] != pipes_other[p]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
