"""examples/quickstart.ipynb runs top to bottom on the CPU (skipped without nbclient / ipykernel)."""

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def test_quickstart_is_saved_without_outputs():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code
    for c in code:
        assert c["outputs"] == [] and c["execution_count"] is None, "save the notebook without outputs"


def test_quickstart_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")  # the notebook draws plots
    monkeypatch.chdir(tmp_path)  # the kernel starts in tmp_path: nothing is written into the repository
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own (inline) backend shows the figures
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 2  # the selection map and the score distribution
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "check_topk passed" in text
