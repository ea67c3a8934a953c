#!/usr/bin/env python3
"""One-process A/B of a kernel source file (a scoring kernel's, or the select kernels'
select_fast.cu): the working tree's version against others, on one benchmark case, their
graph replays alternated round after round.

    python scripts/ab_kernels.py --source score_ks.cu --case prefill-chunk --against HEAD
    python scripts/ab_kernels.py --source score_dense.cu --case prefill-8K --against HEAD~2 --against my_dense.cu
    python scripts/ab_kernels.py --source score_wgmma.cu --case decode-128K --against HEAD --rounds 6
    python scripts/ab_kernels.py --source select_fast.cu --case prefill-8K --against HEAD
    python scripts/ab_kernels.py --source score_dense.cu --against HEAD --save ab/   # then --against ab/score_dense@HEAD.cu

Why one process: this host's and the GPU's state (clocks, power, the tensor probe) move
between runs by more than most single changes gain, so a change is judged against the code
it replaces in the same process, the versions timed in turn (docs/performance.md, every
version since v22).

A version is the whole source file: from a git revision (compiled with that revision's
headers) or from a file (a whole copy of the source, compiled with the working tree's
headers). Every scoring kind that reads the file takes the version (score_wgmma.cu: the
single-query and pair kernels), and so do the kernels launched beside it from the same file
(the keys-stationary query staging, the dense kernel's key images); select_fast.cu's version
serves every select kernel of the call. The launch code is the working tree's, so a version
must take its launch arguments.

Per version it prints the whole call's and the scoring kernel's graph time (ms) each round
and their medians, and whether its answers on the first input set (indices and scores) are
the working tree's bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from indexer import _jit  # noqa: E402

#: the select kernels' source (indexer.cuda_ops._SELECT_SOURCE at rest)
SELECT_SOURCE = "select_fast.cu"


def version_text(spec: str, source: str, scratch: Path, root: Path = ROOT) -> str:
    """The source text (includes inlined) of ``kernels/<source>`` as version ``spec`` has it:
    a file path (compiled with the working tree's headers) or else a git revision of the
    repository at ``root`` (its whole kernels/ folder unpacked under ``scratch``). Raises
    ValueError naming --against when it is neither."""
    path = Path(spec)
    if path.is_file():
        folder = scratch / f"file{len(list(scratch.iterdir()))}"
        folder.mkdir()
        for header in _jit.kernel_dir().glob("*.cuh"):
            (folder / header.name).write_bytes(header.read_bytes())
        (folder / source).write_bytes(path.read_bytes())
        return _jit._inline(folder / source, {folder / source})
    folder = scratch / f"rev{len(list(scratch.iterdir()))}"
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", spec, "kernels"], capture_output=True)
    if archive.returncode != 0:
        raise ValueError(f"--against: {spec!r} is neither a file nor a git revision "
                         f"({archive.stderr.decode(errors='replace').strip()})")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    target = folder / "kernels" / source
    if not target.is_file():
        raise ValueError(f"--against: revision {spec!r} has no kernels/{source}")
    return _jit._inline(target, {target})


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="the kernel source file under kernels/, e.g. score_ks.cu")
    ap.add_argument("--case", help="a benchmark case (scripts/bench.py --cases); not with --save")
    ap.add_argument("--against", action="append", required=True,
                    help="a git revision or a file holding another version of the source (repeatable)")
    ap.add_argument("--rounds", type=int, default=4, help="alternations (default 4)")
    ap.add_argument("--repeats", type=int, default=20, help="graph replays timed a measurement (default 20)")
    ap.add_argument("--fast-kernel", default="auto", help="force the scoring kernel (as score_topk's _fast_kernel)")
    ap.add_argument("--save", metavar="DIR",
                    help="write each --against version, its headers inlined, to DIR as a file to pass as --against "
                         "where the repository's history is not at hand (the device's copy of the working tree), "
                         "and stop; no GPU needed")
    args = ap.parse_args(argv)
    if args.save is None and args.case is None:
        ap.error("--case: required (unless --save)")
    swappable = sorted(s for s in _jit.INSTANCES if s.startswith("score_") or s == SELECT_SOURCE)
    if args.source not in swappable:
        ap.error(f"--source: {args.source!r} is not a scoring or select kernel's source (known: {', '.join(swappable)})")
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats: at least 1")
    return args


def save_versions(source: str, specs: list[str], out_dir: Path, root: Path = ROOT) -> list[Path]:
    """Each version in ``specs`` (as --against takes them) of ``kernels/<source>``, its
    headers inlined, written to ``out_dir`` as ``<stem>@<spec>.cu`` (characters other than
    letters, digits, '.', '-' and '_' as '_'). Returns the paths; raises ValueError as
    version_text does."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with tempfile.TemporaryDirectory() as scratch:
        for spec in specs:
            text = version_text(spec, source, Path(scratch), root)
            safe = "".join(ch if ch.isalnum() or ch in ".-_" else "_" for ch in spec)
            path = out_dir / f"{Path(source).stem}@{safe}.cu"
            path.write_text(text)
            paths.append(path)
    return paths


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.save is not None:
        try:
            for path in save_versions(args.source, args.against, Path(args.save)):
                print(path)
        except ValueError as e:
            print(f"ab_kernels.py: {e}", file=sys.stderr)
            return 2
        return 0
    return _run(args)


def _run(args) -> int:  # gpu-only
    from indexer import bench  # noqa: PLC0415

    try:
        case = bench.select_cases(args.case)[0]
        cp = bench.require_gpu()
    except (ValueError, bench.GPUUnavailable) as e:  # one line, naming the option
        print(f"ab_kernels.py: {str(e).replace('--cases:', '--case:')}", file=sys.stderr)
        return 2
    from indexer import Workspace, cuda_ops  # noqa: PLC0415

    kinds = [k for k, s in cuda_ops._SCORING_SOURCES.items() if s == args.source]
    is_select = args.source == SELECT_SOURCE
    names = {"main": args.source}
    texts = {}
    with tempfile.TemporaryDirectory() as scratch:
        for i, spec in enumerate(args.against):
            tag = f"{args.source}@{i}:{spec}"
            try:
                texts[tag] = version_text(spec, args.source, Path(scratch))
            except ValueError as e:
                print(f"ab_kernels.py: {e}", file=sys.stderr)
                return 2
            names[spec if spec not in names else tag] = tag
    saved = dict(cuda_ops._SCORING_SOURCES), cuda_ops._SELECT_SOURCE
    sets, _ = bench.input_sets(case, cp, 0)

    def call(x, ws, score_only=False, scores=False):
        return bench.call_case(cuda_ops, x, case.top_k, validate=False, workspace=ws, _score_only=score_only,
                               return_scores=scores, _fast_kernel=args.fast_kernel)

    answers, times = {}, {}
    # the versions compile through _jit as sources of their own, the same instances
    with _jit.source_versions(texts, like=args.source):
        try:
            for r in range(args.rounds):
                for label, source in names.items():
                    cuda_ops._SCORING_SOURCES.update({k: source for k in kinds})
                    if is_select:
                        cuda_ops._SELECT_SOURCE = source
                    cuda_ops.clear_plans()
                    ws = Workspace()
                    if r == 0:
                        answers[label] = [a.get() for a in call(sets[0], ws, scores=True)]
                    whole = bench.time_graph(cp, lambda x: call(x, ws), sets, repeats=args.repeats)
                    scoring = bench.time_graph(cp, lambda x: call(x, ws, score_only=True), sets, repeats=args.repeats)
                    # None where a graph could not be captured
                    times.setdefault(label, []).append(
                        tuple(float("nan") if t is None else t for t in (whole, scoring)))
        finally:
            cuda_ops._SCORING_SOURCES.update(saved[0])
            cuda_ops._SELECT_SOURCE = saved[1]
            cuda_ops.clear_plans()
    print(f"{case.name}, {args.source}: graph ms, {args.rounds} rounds (whole call | scoring alone)")
    for label, rows in times.items():
        same = "" if label == "main" else (
            "  answers bit for bit" if all(a.tobytes() == b.tobytes() for a, b in zip(answers[label], answers["main"]))
            else "  ANSWERS DIFFER")
        per_round = " ".join(f"{w:.4f}|{s:.4f}" for w, s in rows)
        print(f"{label:>20s}  median {statistics.median(w for w, _ in rows):9.4f} | "
              f"{statistics.median(s for _, s in rows):9.4f}   rounds {per_round}{same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
