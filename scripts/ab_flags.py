#!/usr/bin/env python3
"""One-process A/B of indexer.cuda_ops's module settings (the switches kept for tests and
A/Bs, such as _QUERY_IMAGE or _CLAIMED_SHARES), of indexer.geometry's rules (as
geometry.NAME) and of the call's own choices (as call.KEYWORD: cuda_ops.score_topk's
_fast_kernel, _select) on benchmark cases, the bench's or of one's own shape
(decode-4x262144, mtp3-16x65536: indexer.bench.CUSTOM_CASE): the defaults against each
variant, graph replays of whole calls alternated round after round, with whether each
variant's answers are the defaults' bit for bit.

    python scripts/ab_flags.py --cases decode-1M,decode-E256 --variant _QUERY_IMAGE=False
    python scripts/ab_flags.py --cases decode-1M --variant _CLAIMED_SHARES=False --variant _QUERY_IMAGE=False,_CLAIMED_SHARES=False
    python scripts/ab_flags.py --cases decode-3x262144,decode-4x262144 --variant geometry.RANK_ALL_PAIRS_WORK=4096
    python scripts/ab_flags.py --cases decode-16x4096 --variant geometry.ROW_SELECT_MAX_LEN=0 --precision exact
    python scripts/ab_flags.py --cases decode-1x2048 --variant "call._fast_kernel='wgmma'"

A variant is NAME=VALUE[,NAME=VALUE...], each VALUE a Python literal. Launch plans are
cleared at every switch (they are cached by call shape). Device only.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from indexer import bench  # noqa: E402


def _owner(module, name: str):
    """(object, attribute) that a setting's name reaches from ``module``: NAME, or a dotted
    path through the module's own attributes (geometry.RANK_ALL_PAIRS_ROWS: indexer.geometry,
    as indexer.cuda_ops imports it); None where the path or the setting is missing."""
    *path, attr = name.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return (owner, attr) if hasattr(owner, attr) else None


def get_setting(module, name: str):
    owner, attr = _owner(module, name)
    return getattr(owner, attr)


def set_setting(module, name: str, value) -> None:
    owner, attr = _owner(module, name)
    setattr(owner, attr, value)


#: keywords the timed calls pass themselves (bench.call_case and this script's call)
_CALL_OWN = ("precision", "validate", "workspace", "return_scores", "_cu_seqlens")


def is_call_keyword(module, name: str) -> bool:
    """Whether ``name`` is call.KEYWORD with KEYWORD a keyword-only parameter of
    ``module.score_topk`` that the timed calls do not pass themselves (a choice the call
    takes, such as _fast_kernel or _select, rather than a setting)."""
    fn = getattr(module, "score_topk", None)
    if not name.startswith("call.") or fn is None or name[5:] in _CALL_OWN:
        return False
    param = inspect.signature(fn).parameters.get(name[5:])
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


def parse_variant(spec: str, module) -> dict:
    """{name: value} of a NAME=VALUE[,NAME=VALUE...] spec (NAME a setting of the module, or
    a dotted path to one of a module it holds, e.g. geometry.RANK_ALL_PAIRS_ROWS, or
    call.KEYWORD, a keyword the variant's calls pass to ``module.score_topk``, e.g.
    call._fast_kernel='wgmma'); ValueError naming --variant for a name the module does not
    reach or a value that is not a Python literal."""
    out = {}
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or (_owner(module, name) is None and not is_call_keyword(module, name)):
            raise ValueError(f"--variant: expected NAME=VALUE with NAME a setting of indexer.cuda_ops "
                             f"(or of a module it holds: geometry.NAME) or call.KEYWORD of its score_topk, "
                             f"got {part!r}")
        try:
            out[name] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"--variant: {name}'s value {value!r} is not a Python literal") from None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", required=True, help="benchmark cases, comma-separated")
    ap.add_argument("--variant", action="append", required=True, help="NAME=VALUE[,NAME=VALUE...]")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=20, help="graph replays a timing")
    ap.add_argument("--precision", choices=("fast", "exact"), default="fast", help="the path timed")
    args = ap.parse_args(argv)
    try:
        cases = bench.select_cases(args.cases)
        cp = bench.require_gpu()
    except (ValueError, bench.GPUUnavailable) as e:
        print(f"ab_flags.py: {e}", file=sys.stderr)
        return 2
    from indexer import Workspace, cuda_ops  # imports CuPy

    try:
        variants = {"defaults": {}} | {spec: parse_variant(spec, cuda_ops) for spec in args.variant}
    except ValueError as e:
        print(f"ab_flags.py: {e}", file=sys.stderr)
        return 2
    # each variant's module settings and its call keywords (call.KEYWORD), apart once
    keywords = {label: {n[5:]: v for n, v in settings.items() if is_call_keyword(cuda_ops, n)}
                for label, settings in variants.items()}
    variants = {label: {n: v for n, v in settings.items() if not is_call_keyword(cuda_ops, n)}
                for label, settings in variants.items()}
    defaults = {name: get_setting(cuda_ops, name) for v in variants.values() for name in v}
    for case in cases:
        sets, _ = bench.input_sets(case, cp, 0)
        times, answers = {}, {}
        try:
            for r in range(args.rounds):
                for label, settings in variants.items():
                    for name, value in {**defaults, **settings}.items():
                        set_setting(cuda_ops, name, value)
                    cuda_ops.clear_plans()
                    ws = Workspace()

                    def call(x, ws=ws, scores=False, keywords=keywords[label]):
                        return bench.call_case(cuda_ops, x, case.top_k, validate=False, workspace=ws,
                                               return_scores=scores, precision=args.precision, **keywords)

                    if r == 0:
                        answers[label] = [a.get() for a in call(sets[0], scores=True)]
                    t = bench.time_graph(cp, call, sets, repeats=args.repeats, echo=lambda *a: None)
                    times.setdefault(label, []).append(float("nan") if t is None else t)
        finally:
            for name, value in defaults.items():
                set_setting(cuda_ops, name, value)
            cuda_ops.clear_plans()
        print(f"{case.name}: whole call ({args.precision}), graph ms, {args.rounds} rounds")
        for label, ts in times.items():
            same = "" if label == "defaults" else (
                "  answers bit for bit" if all(a.tobytes() == b.tobytes()
                                               for a, b in zip(answers[label], answers["defaults"]))
                else "  ANSWERS DIFFER")
            print(f"  {label:>40s}  median {statistics.median(ts):.4f}   rounds "
                  + " ".join(f"{t:.4f}" for t in ts) + same)
        del sets
        bench.free_device_memory(cp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
