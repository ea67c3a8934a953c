"""examples/engine_decode_step.py: imports without a GPU; runs (small) where there is one."""

import importlib.util
import inspect
from pathlib import Path

import pytest

from tests.gpu import requires_gpu

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "engine_decode_step.py"


def load_example():
    spec = importlib.util.spec_from_file_location("engine_decode_step", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_imports_without_torch_or_cupy():
    params = inspect.signature(load_example().main).parameters
    assert "steps" in params and "device" in params


@requires_gpu
@pytest.mark.gpu
def test_example_runs_small():
    pytest.importorskip("torch")
    summary = load_example().main(steps=3, device=0, batch=2, context=300, top_k=64, hidden=64, verbose=False)
    assert summary["steps"] == 3 and summary["graph_matches_eager"] == 3 and summary["prepared_matches_eager"] == 3
    assert summary["workspace_bytes"] > 0 and summary["entries"] == 303
