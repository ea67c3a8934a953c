#!/usr/bin/env python3
"""Fail when a module that runs without a GPU is below a line-coverage threshold.

    python scripts/check_coverage.py coverage.json 90

Modules that need CuPy and a GPU to run at all (the CUDA launch code) are listed in
GPU_ONLY and reported but not held to the threshold: CI has no GPU, and their tests run on
the device machine. Modules that need an optional library (NEEDS) are held to it only where
that library imports.
"""

import json
import sys

GPU_ONLY = {"indexer/cuda_ops.py", "indexer/device_checks.py"}
# modules that need an optional library: held to the threshold where it imports (CI installs
# PyTorch's CPU build), reported otherwise
NEEDS = {"indexer/torch_ops.py": "torch"}


def _importable(module: str) -> bool:
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec(module) is not None


def main(path, threshold):
    files = json.load(open(path))["files"]
    failed = []
    for name, data in sorted(files.items()):
        pct = data["summary"]["percent_covered"]
        if name in GPU_ONLY:
            tag = "gpu-only"
        elif name in NEEDS and not _importable(NEEDS[name]):
            tag = f"needs {NEEDS[name]}"
        else:
            tag = "ok" if pct >= threshold else "LOW"
        print(f"{name:32s} {pct:6.1f}%  {tag}")
        if tag == "LOW":
            failed.append(name)
    if failed:
        print(f"below {threshold}%: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) != 3:
        print("usage: python scripts/check_coverage.py COVERAGE_JSON THRESHOLD_PERCENT", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
