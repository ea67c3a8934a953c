"""exp/ablate_wgmma.py's variants still apply to kernels/score_wgmma.cu.

Each variant is a list of text substitutions into the scoring kernels; a kernel edit that
changes one of the replaced lines leaves the variant unbuildable (v110 found two such, by
hand). No GPU and no compiler needed: the substitutions alone are checked here."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ablate_module():
    spec = importlib.util.spec_from_file_location("ablate_wgmma", ROOT / "exp" / "ablate_wgmma.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ABLATE = _ablate_module()


@pytest.fixture(scope="module")
def inlined_source():
    from indexer import _jit

    return _jit._inline(ABLATE.SOURCE, {ABLATE.SOURCE})


@pytest.mark.parametrize("name", sorted(ABLATE.VARIANTS))
def test_every_variant_applies_and_changes_the_kernel_text(name, inlined_source, tmp_path):
    # write_variants raises ValueError where an old string is not found exactly once
    (path,) = ABLATE.write_variants(tmp_path, [name])
    text = path.read_text()
    assert text != inlined_source
    assert "ablation stand-ins" in text  # the helpers the variants call are there


def test_a_stale_substitution_is_refused_by_name(inlined_source):
    with pytest.raises(ValueError, match="no such line"):
        ABLATE.variant_text(inlined_source, [("no such line in the kernel;", "x;")], "single")
