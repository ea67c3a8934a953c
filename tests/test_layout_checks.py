"""scripts/compile_kernels.py's layout checks (CPU): every shared-memory size indexer.geometry
computes for a launch is among the sizes CI asserts against the kernels' layout structs at
compile time, so that a kernel's layout and its launch cannot drift apart unseen."""

import importlib.util
import re
from pathlib import Path

from indexer import geometry

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("compile_kernels", ROOT / "scripts" / "compile_kernels.py")
compile_kernels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compile_kernels)


def test_every_smem_size_of_geometry_is_checked_against_its_kernel():
    checks = compile_kernels.layout_checks()
    values = {int(m) for conditions in checks.values() for c in conditions for m in re.findall(r"== (\d+)$", c)}
    sizes = [name for name in dir(geometry) if name.endswith("_smem_bytes")]
    assert len(sizes) >= 5
    for name in sizes:
        assert getattr(geometry, name)(128) in values, name
    assert geometry.KS_QUERY_BYTES in values
    for source in checks:
        assert (ROOT / "kernels" / source).is_file()



def test_an_nvrtc_asked_for_is_taken_or_refused(tmp_path, monkeypatch):
    # CI compiles every kernel with a given NVRTC version (.ci/run): a wrong path must fail,
    # not quietly compile with another NVRTC found elsewhere
    missing = tmp_path / "libnvrtc.so.12"
    monkeypatch.setenv("INDEXER_NVRTC", str(missing))
    try:
        compile_kernels.find_nvrtc()
    except SystemExit as e:
        assert "INDEXER_NVRTC" in str(e) and str(missing) in str(e)
    else:
        raise AssertionError("a missing INDEXER_NVRTC was not refused")
    missing.write_bytes(b"")
    assert compile_kernels.find_nvrtc() == str(missing)
