"""The kernels as an A100 or an Ada GPU runs them, on this GPU: NVRTC compiles each one for
compute_80 (PTX: the logic-op E2M1 decode and E4M3 scale conversion, no griddepcontrol, no
Hopper paths), the driver JIT-compiles that PTX for this GPU, and the calls are planned for
a compute capability 8.0 device (the mma.sync fast path, the FP32 exact path, the selects).
No other test runs this code: the native build here takes the hardware conversions. Its
answers must meet the reference and, on the fast path, equal the native build of the same
mma.sync kernel bit for bit (the two decodes give the same fp16 values)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.gpu import requires_gpu
from indexer import _jit, testing

pytestmark = requires_gpu

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = ["-std=c++17", "-arch=compute_80", "-ftz=true"]  # the run-time options, for sm_80's virtual target


def _compile_kernels():
    spec = importlib.util.spec_from_file_location("compile_kernels", ROOT / "scripts" / "compile_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def sm80_build(folder):
    """Calls planned for a compute capability 8.0 device (an A100's shared memory a block, this
    GPU's SMs) whose kernels are the compute_80 PTX build; yields {(source, instance)} built."""
    import cupy as cp

    from indexer import cuda_ops

    ck = _compile_kernels()
    nvrtc = ck.Nvrtc(ck.find_nvrtc())  # CuPy's NVRTC is loaded by now: the caller ran a native call
    built = {}

    def get_kernel(source, name_expression, device_id=None):
        key = (source, name_expression)
        if key not in built:
            ptx, lowered = nvrtc.ptx(_jit.read_source(source), source, name_expression, OPTIONS)
            assert ".target sm_80" in ptx and "e4m3x2" not in ptx and "griddepcontrol" not in ptx, name_expression
            path = Path(folder) / f"{len(built)}.ptx"
            path.write_text(ptx)
            built[key] = cp.RawModule(path=str(path)).get_function(lowered)
        return built[key]

    a100 = dataclasses.replace(cuda_ops.device_facts(0), compute_capability=80, max_smem_per_block=166912)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_jit, "get_kernel", get_kernel)
        m.setattr(cuda_ops, "device_facts", lambda device_id: a100)
        m.setenv("INDEXER_PDL", "0")  # (eager calls launch the ordinary way anyway)
        cuda_ops.clear_plans()
        try:
            yield built
        finally:
            cuda_ops.clear_plans()


def _every_scale_byte(p, rng):
    """p with the scale rows of a few dozen entries set to every byte value in turn
    (subnormals, the largest, NaN 0x7f / 0xff, negative scales): the sm_80 build converts
    them in software, the native build in hardware."""
    flat = p.key_scale.reshape(-1, p.key_scale.shape[-1])
    rows = rng.choice(flat.shape[0], size=min(flat.shape[0], 256 // flat.shape[1] + 32), replace=False)
    flat[rows] = (np.arange(rows.size * flat.shape[1]) % 256).astype(np.uint8).reshape(rows.size, -1)
    return p


CASES = [  # (H, D, E, lens, top_k)
    (64, 128, 64, [0, 1, 63, 700, 5_000, 9_001], 100),
    (16, 64, 16, [17, 2_000, 4_096], 40),
    (40, 96, 32, [3_333, 128], 64),
]


@pytest.mark.parametrize("H, D, E, lens, top_k", CASES)
def test_the_sm80_build_meets_the_reference_and_equals_the_native_build(tmp_path, H, D, E, lens, top_k):
    import cupy as cp

    import indexer
    from indexer import cuda_ops

    rng = np.random.default_rng(80 + H + D)
    p = _every_scale_byte(testing.random_problem(rng, T=len(lens), H=H, D=D, E=E, lens=lens, top_k=top_k), rng)
    args = [cp.asarray(x) for x in p.arrays()]
    exact = testing.exact_scores(p)
    cuda_ops.clear_plans()
    native = [x.get() for x in cuda_ops.score_topk(*args, p.top_k, return_scores=True, _fast_kernel="mma")]
    with sm80_build(tmp_path) as built:
        for precision, tol in (("fast", testing.TOL_FAST), ("exact", testing.TOL_EXACT)):
            idx, sc = (x.get() for x in indexer.score_topk(*args, p.top_k, precision=precision, return_scores=True))
            testing.check_topk(p, idx, sc, tol=tol, exact=exact)
            if precision == "fast":
                np.testing.assert_array_equal(sc, native[1])
                np.testing.assert_array_equal(idx, native[0])
    names = {name for _, name in built}
    # planned as on an sm_80 device: the mma.sync and FP32 kernels, no Hopper kernel
    assert any(n.startswith("score_mma_kernel") for n in names) and any(n.startswith("score_fp32") for n in names)
    assert not any("wgmma" in n or n.startswith(("score_ws", "score_ks", "score_dense")) for n in names)


def test_the_sm80_build_of_grouped_calls(tmp_path):
    # rows of sequences (score_topk_ragged: the per-token table's expansion, then the same
    # kernels a row at a time, as every GPU before Hopper runs prefill and multi-token decode)
    import cupy as cp

    import indexer
    from tests.test_ragged import as_problem, grouped_problem

    rng = np.random.default_rng(88)
    host = grouped_problem(rng, [5, 0, 3], H=64, D=128, E=64, seq_entries=[1_500, 40, 6_000], top_k=48)
    cp.asarray(np.ones(1)).sum()  # a native kernel first: CuPy's NVRTC loaded
    with sm80_build(tmp_path) as built:
        idx, sc = indexer.score_topk_ragged(*[cp.asarray(x) for x in host], 48, return_scores=True)
    testing.check_topk(as_problem(*host, 48), idx.get(), sc.get(), tol=testing.TOL_FAST)
    assert ("ragged.cu", "expand_block_table_kernel") in built
