"""scripts/ab_flags.py's host side (CPU): the variants it parses, and what it refuses."""

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("ab_flags", ROOT / "scripts" / "ab_flags.py")
ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab)


def test_a_variant_is_the_settings_it_names():
    module = types.SimpleNamespace(_QUERY_IMAGE=True, _CLAIMED_SHARES=True, _SELECT_SOURCE="select_fast.cu")
    assert ab.parse_variant("_QUERY_IMAGE=False", module) == {"_QUERY_IMAGE": False}
    assert ab.parse_variant("_QUERY_IMAGE=False, _SELECT_SOURCE='x.cu'", module) == {
        "_QUERY_IMAGE": False, "_SELECT_SOURCE": "x.cu"}


def test_a_variant_may_name_a_rule_of_a_module_cuda_ops_holds():
    geometry = types.SimpleNamespace(RANK_ALL_PAIRS_ROWS=4)
    module = types.SimpleNamespace(_QUERY_IMAGE=True, geometry=geometry)
    assert ab.parse_variant("geometry.RANK_ALL_PAIRS_ROWS=2, _QUERY_IMAGE=False", module) == {
        "geometry.RANK_ALL_PAIRS_ROWS": 2, "_QUERY_IMAGE": False}
    assert ab.get_setting(module, "geometry.RANK_ALL_PAIRS_ROWS") == 4
    ab.set_setting(module, "geometry.RANK_ALL_PAIRS_ROWS", 2)
    assert geometry.RANK_ALL_PAIRS_ROWS == 2
    for spec in ("geometry.NO_SUCH=1", "no_such.RANK_ALL_PAIRS_ROWS=1", "geometry.RANK_ALL_PAIRS_ROWS.x=1"):
        with pytest.raises(ValueError, match="--variant: expected NAME=VALUE .*geometry.NAME"):
            ab.parse_variant(spec, module)


@pytest.mark.parametrize("spec, message", [
    ("_NO_SUCH=1", "NAME a setting of indexer.cuda_ops (or of a module it holds: geometry.NAME) or call.KEYWORD "
                   "of its score_topk, got '_NO_SUCH=1'"),
    ("_QUERY_IMAGE", "got '_QUERY_IMAGE'"),
    ("_QUERY_IMAGE=no", "_QUERY_IMAGE's value 'no' is not a Python literal"),
])
def test_a_bad_variant_is_refused_by_name(spec, message):
    module = types.SimpleNamespace(_QUERY_IMAGE=True)
    with pytest.raises(ValueError, match="--variant: .*" + re.escape(message)):
        ab.parse_variant(spec, module)


def test_an_unknown_case_is_refused_before_any_gpu_work():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_flags.py"), "--cases", "no-such-case",
                           "--variant", "_QUERY_IMAGE=False"], capture_output=True, text=True)
    assert done.returncode == 2 and "ab_flags.py:" in done.stderr and "no-such-case" in done.stderr


def test_a_variant_may_name_a_keyword_of_the_call():
    def score_topk(q, w, top_k, *, precision="fast", _fast_kernel="auto", _select="auto"):
        return None

    module = types.SimpleNamespace(_QUERY_IMAGE=True, score_topk=score_topk)
    assert ab.parse_variant("call._fast_kernel='wgmma', _QUERY_IMAGE=False", module) == {
        "call._fast_kernel": "wgmma", "_QUERY_IMAGE": False}
    assert ab.is_call_keyword(module, "call._select") and not ab.is_call_keyword(module, "_select")
    for spec in ("call._no_such='x'", "call.top_k=3", "call.q=1", "call.precision='exact'"):
        with pytest.raises(ValueError, match="--variant: expected NAME=VALUE .*call.KEYWORD"):
            ab.parse_variant(spec, module)
