"""scripts/compile_kernels.py's layout checks (CPU): every shared-memory size indexer.geometry
computes for a launch is among the sizes CI asserts against the kernels' layout structs at
compile time, so that a kernel's layout and its launch cannot drift apart unseen."""

import importlib.util
import re
from pathlib import Path

import pytest

from indexer import _jit, geometry

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
    assert geometry.wgmma_query_image_bytes(128) in values and geometry.KS_QUERY_BYTES in values
    for source in checks:
        assert (ROOT / "kernels" / source).is_file()


def test_the_query_image_is_b_and_the_weights_in_whole_16_byte_pieces():
    for d in (32, 64, 96, 128):
        img = geometry.wgmma_query_image_bytes(d)
        assert img == (d // 8) * 1024 + 64 * 4 and img % 16 == 0
        assert img < 64 * (d + 8) * 2 + 64 * 4  # smaller than the staged rows and weights it replaces


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


def _nvrtc_or_skip():
    try:
        return compile_kernels.Nvrtc(compile_kernels.find_nvrtc())
    except SystemExit:
        pytest.skip("no NVRTC here (pip install 'nvidia-cuda-nvrtc==13.0.*')")


@pytest.mark.parametrize("target, hardware", [("compute_80", False), ("compute_89", True), ("compute_90", True)])
def test_the_e4m3_conversion_is_the_hardware_one_where_it_assembles(target, hardware):
    # INDEXER_CVT_E4M3X2 (kernels/fast_common.cuh): sm_90, and sm_89 from NVRTC 12.1 (CI's and
    # the device's are 13.0), take cvt.rn.f16x2.e4m3x2; sm_80 the logic-op form. The PTX of the
    # mma.sync kernel for each virtual target (what tests/test_cuda_sm80_build.py runs for 8.0)
    nvrtc = _nvrtc_or_skip()
    if target == "compute_89" and nvrtc.version() < (12, 1):
        hardware = False
    name = "score_mma_kernel<128, 8>"
    ptx, lowered = nvrtc.ptx(_jit.read_source("score_mma.cu"), "score_mma.cu", name,
                             ["-std=c++17", f"-arch={target}", "-ftz=true"])
    assert f".target sm_{target[-2:]}" in ptx and lowered.startswith("_Z16score_mma_kernel") and lowered in ptx
    assert ("cvt.rn.f16x2.e4m3x2" in ptx) == hardware
    with pytest.raises(RuntimeError, match="score_mma_kernel<128, 8>"):  # NVRTC's log, named
        nvrtc.ptx("#error no such kernel\n", "x.cu", name, ["-arch=compute_80"])
