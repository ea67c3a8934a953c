"""examples/engine_decode_step.py and compiled_decode_step.py: import without a GPU; run
(small) where there is one."""

import importlib.util
import inspect
from pathlib import Path

import pytest

from tests.gpu import requires_gpu

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name="engine_decode_step"):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["engine_decode_step", "compiled_decode_step"])
def test_example_imports_without_torch_or_cupy(name):
    params = inspect.signature(load_example(name).main).parameters
    assert "steps" in params and "device" in params


@requires_gpu
@pytest.mark.gpu
def test_example_runs_small():
    pytest.importorskip("torch")
    summary = load_example().main(steps=3, device=0, batch=2, context=300, top_k=64, hidden=64, verbose=False)
    assert summary["steps"] == 3 and summary["graph_matches_eager"] == 3 and summary["prepared_matches_eager"] == 3
    assert summary["workspace_bytes"] > 0 and summary["entries"] == 303


@requires_gpu
@pytest.mark.gpu
def test_compiled_example_runs_small():
    pytest.importorskip("torch")
    summary = load_example("compiled_decode_step").main(steps=3, batch=2, padded_batch=3, context=300, top_k=64,
                                                        verbose=False)
    assert summary["steps"] == 3 and summary["replay_matches_eager"] == 3 and summary["pool_matches_host"]
    assert summary["entries"] == 303
