"""The README's Python snippets run as written, one after another as a reader would paste
them into one session, on the NumPy backend (no GPU): a snippet that needs a CUDA device is
left out, one that imports PyTorch runs where PyTorch is installed."""

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.gpu import requires_gpu

ROOT = Path(__file__).resolve().parent.parent


def _snippets():
    text = (ROOT / "README.md").read_text()
    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", text, re.S)]


def _run(code, tmp_path):
    script = tmp_path / "snippets.py"
    script.write_text(code)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}  # the NumPy backend
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=300)


def _code(snippet):
    """The snippet without its comments (which may name a device the code does not use)."""
    return "\n".join(line.split("#")[0] for line in snippet.splitlines())


def test_the_host_snippets_run_in_order(tmp_path):
    host = [s for s in _snippets() if "cuda" not in _code(s) and "import torch" not in s]
    assert len(host) >= 4  # the pool, the raw arrays, the grouped call, the prepared call
    r = _run("\n".join(host) + "\nprint('done', idx.shape)\n", tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("done (4, 2, 512)"), r.stdout + r.stderr


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_the_pytorch_snippet_runs(tmp_path):
    (snippet,) = [s for s in _snippets() if "import torch" in s]
    r = _run(snippet + "\nprint('done', layer_topk.__class__.__name__)\n", tmp_path)
    assert r.returncode == 0 and "done" in r.stdout, r.stdout + r.stderr


@requires_gpu
@pytest.mark.gpu
def test_the_host_snippets_run_on_a_gpu_pool(tmp_path):
    """The same snippets with the first one's pool on the GPU (``device="cuda"``, as its
    comment offers): NumPy queries beside the pool's device arrays, the grouped call's NumPy
    lengths, the prepared call per layer."""
    host = [s for s in _snippets() if "cuda" not in _code(s) and "import torch" not in s]
    old = "KeyPool(num_blocks=1024, entries_per_block=64, head_dim=128)"
    assert old in host[0]
    host[0] = host[0].replace(old, old[:-1] + ', device="cuda")')
    script = tmp_path / "snippets.py"
    script.write_text("\n".join(host) + "\nprint('done', type(idx).__name__, idx.shape)\n")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("done ndarray (4, 2, 512)"), r.stdout + r.stderr
