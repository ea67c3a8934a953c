"""The GPU-only scripts and examples on a machine without a GPU the kernels run on: one line
saying what is missing and a non-zero exit, never a traceback; their --help works anywhere."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from indexer import arrays

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(arrays.gpu_supported(), reason="runs where no GPU the kernels run on is found")


def _run(*args):
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)


@pytest.mark.parametrize("script,rc,line", [
    ("scripts/stress.py", 2, "stress: needs CuPy and a CUDA GPU of compute capability 8.0 or newer"),
    ("scripts/sanitize.py", 2, "sanitize: needs CuPy and a CUDA GPU of compute capability 8.0 or newer"),
    ("scripts/bench.py", 2, "bench: needs CuPy and a CUDA GPU"),
    ("scripts/probe_ceiling.py", 2, "bench: needs CuPy and a CUDA GPU"),
    ("scripts/probe_timeline.py", 2, "bench: needs CuPy and a CUDA GPU"),
    ("scripts/sustained_rate.py", 2, "bench: needs CuPy and a CUDA GPU"),
    ("scripts/occupancy.py", 2, r"bench: needs CuPy and a CUDA GPU \(--static needs none\)"),
    ("examples/engine_decode_step.py", 1, r"engine_decode_step: needs (torch|cupy|a CUDA GPU)"),
    ("examples/compiled_decode_step.py", 1, r"compiled_decode_step: needs (torch|cupy|a CUDA GPU)"),
])
def test_says_what_it_lacks_in_one_line(script, rc, line):
    r = _run(ROOT / script)
    said = (r.stdout + r.stderr).strip()
    assert r.returncode == rc, said
    assert "Traceback" not in said and len(said.splitlines()) == 1 and re.fullmatch(line + ".*", said), said
    assert _run(ROOT / script, "--help").returncode == 0


@pytest.mark.parametrize("script,args,line", [
    ("scripts/kernel_times.py", ["decode-latency"], "kernel_times: bench: needs CuPy and a CUDA GPU"),
    ("scripts/kernel_times.py", [], "usage: python scripts/kernel_times.py CASE"),
    ("scripts/check_coverage.py", [], "usage: python scripts/check_coverage.py COVERAGE_JSON THRESHOLD_PERCENT"),
])
def test_scripts_with_arguments_say_what_they_lack_in_one_line(script, args, line):
    r = _run(ROOT / script, *args)
    said = (r.stdout + r.stderr).strip()
    assert r.returncode == 2 and "Traceback" not in said and said == line, said
    assert _run(ROOT / script, "--help").returncode == 0
