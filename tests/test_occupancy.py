"""scripts/occupancy.py's static form (CPU): CTAs per SM from a kernel's registers, threads
and shared memory by sm_90's limits, and, where NVRTC and cuobjdump are installed (CI
installs both), each scoring kernel's compiled resources against the CTAs per SM its
launch geometry assumes: a change that costs a kernel a resident CTA fails here, before a
device run reads it as a slowdown."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("occupancy", ROOT / "scripts" / "occupancy.py")
occupancy = importlib.util.module_from_spec(_spec)
sys.modules["occupancy"] = occupancy  # its dataclass looks its module up
_spec.loader.exec_module(occupancy)  # (it puts scripts/ on the path, for sass_census)


@pytest.mark.parametrize("regs, threads, shared, ctas", [
    (168, 128, 68_044, 3),    # the single-query wgmma kernel: 3 x 5,376 registers a warp in each file
    (169, 128, 0, 2),         # one register more: 5,632 a warp, two warps a file
    (40, 256, 140, 6),        # the histogram filter: 12 warps a file, CTAs of 8 warps
    (32, 256, 8, 8),          # the sampled filter: threads bind first (2,048)
    (16, 32, 0, 32),          # the 32-CTA cap
    (64, 128, 113_000, 2),    # shared memory: (113,000 + 1,024) rounded to 128 B, twice in 228 KB
    (0, 128, 0, 16),          # no registers reported: threads bind
])
def test_ctas_per_sm_follows_the_binding_limit(regs, threads, shared, ctas):
    assert occupancy.ctas_per_sm(regs, threads, shared) == ctas


def test_the_cubins_shared_figure_holds_the_reserved_kilobyte_from_sm_90_on():
    assert occupancy.cubin_static_shared(1164, "sm_90a") == 140
    assert occupancy.cubin_static_shared(1164, "sm_100") == 140
    assert occupancy.cubin_static_shared(140, "sm_80") == 140 and occupancy.cubin_static_shared(140, "sm_89") == 140


def test_every_launched_kernel_fits_the_ctas_its_geometry_launches():
    import compile_kernels  # noqa: PLC0415  (scripts/, on the path occupancy.py set)
    import sass_census as census  # noqa: PLC0415

    try:
        census.find_cuobjdump()
        compile_kernels.find_nvrtc()
    except (SystemExit, OSError) as e:
        pytest.skip(f"no NVRTC or cuobjdump here ({e})")
    from indexer import _jit  # noqa: PLC0415

    checked = 0
    for source, name, threads, smem, launched in occupancy.rows():
        if launched is None:
            continue
        use = census.resource_usage(name, _jit.read_source(source), source, "sm_90a")
        fit = occupancy.ctas_per_sm(use["REG"], threads, occupancy.cubin_static_shared(use["SHARED"], "sm_90a") + smem)
        assert fit >= launched, f"{name}: {fit} CTAs an SM fit, the geometry launches {launched}"
        checked += 1
    assert checked == 5
