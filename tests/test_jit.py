"""Source loading and the compile table, without a GPU."""

import re

import pytest

from indexer import _jit


def test_kernel_dir_holds_every_source_of_the_table():
    d = _jit.kernel_dir()
    for source in _jit.INSTANCES:
        assert (d / source).is_file()


def test_includes_are_inlined_once_and_the_folder_hash_is_stamped():
    src = _jit.read_source("select_fast.cu")
    assert not re.search(r'#\s*include\s+"', src)  # nothing left for NVRTC to look up
    assert src.count("// ---- begin common.cuh") == 1  # included twice, inlined once
    assert "#pragma once" not in src
    assert src.startswith(f"// indexer kernels {_jit.kernels_hash()}")
    assert "select_row_radix" in src and "score_to_key" in src


def test_hash_changes_when_any_kernel_file_changes(tmp_path, monkeypatch):
    for f in _jit.kernel_dir().glob("*.cu*"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(_jit, "kernel_dir", lambda: tmp_path)
    _jit.kernels_hash.cache_clear()
    _jit.read_source.cache_clear()
    try:
        before = _jit.kernels_hash()
        (tmp_path / "common.cuh").write_text((tmp_path / "common.cuh").read_text() + "\n// edited\n")
        _jit.kernels_hash.cache_clear()
        assert _jit.kernels_hash() != before
        assert "// edited" in _jit.read_source("score_mma.cu")
    finally:
        _jit.kernels_hash.cache_clear()
        _jit.read_source.cache_clear()


def test_unknown_local_include_is_left_for_nvrtc(tmp_path, monkeypatch):
    (tmp_path / "common.cuh").write_text("// common\n")
    (tmp_path / "k.cu").write_text('#include "common.cuh"\n#include "missing.cuh"\n#include <cuda_fp16.h>\n')
    monkeypatch.setattr(_jit, "kernel_dir", lambda: tmp_path)
    _jit.kernels_hash.cache_clear()
    _jit.read_source.cache_clear()
    try:
        src = _jit.read_source("k.cu")
        assert '#include "missing.cuh"' in src and "#include <cuda_fp16.h>" in src and "// common" in src
    finally:
        _jit.kernels_hash.cache_clear()
        _jit.read_source.cache_clear()


@pytest.mark.parametrize("cc,arch", [(90, "sm_90a"), (80, "sm_80"), (89, "sm_89"), (100, "sm_100")])
def test_arch_and_options(cc, arch):
    assert _jit.arch_for(cc) == arch
    assert f"-arch={arch}" in _jit.compile_options(cc)


def test_instances_are_unique_and_listed():
    pairs = _jit.instances()
    assert len(pairs) == len(set(pairs)) == sum(len(v) for v in _jit.INSTANCES.values())
    assert ("score_mma.cu", "score_mma_kernel<128, 8>") in pairs


def test_kernel_dir_missing_is_a_clear_error(tmp_path, monkeypatch):
    fake = tmp_path / "pkg" / "_jit.py"
    fake.parent.mkdir()
    monkeypatch.setattr(_jit, "__file__", str(fake))
    with pytest.raises(FileNotFoundError, match="CUDA sources not found"):
        _jit.kernel_dir()


def test_source_versions_serve_their_texts_only_inside_the_block():
    like = "score_wgmma.cu"
    tag = like + "@test"
    before_instances = dict(_jit.INSTANCES)
    original = _jit.read_source(like)
    with _jit.source_versions({tag: "// another version\n"}, like=like):
        assert _jit.read_source(tag) == "// another version\n"
        assert _jit.read_source(like) == original  # other names read their files
        assert _jit.INSTANCES[tag] == _jit.INSTANCES[like]
    assert tag not in _jit.INSTANCES
    assert _jit.INSTANCES == before_instances
    with pytest.raises(FileNotFoundError):
        _jit.read_source(tag)


def test_source_versions_restore_after_an_error():
    like = "score_wgmma.cu"
    reader = _jit.read_source
    with pytest.raises(RuntimeError):
        with _jit.source_versions({like + "@boom": "x"}, like=like):
            raise RuntimeError("inside")
    assert _jit.read_source is reader
    assert like + "@boom" not in _jit.INSTANCES


def test_query_instances_name_the_element_type_last_and_refuse_a_short_name():
    assert _jit.query_instance("score_wgmma_pairs_kernel<128, true>", "float32") == "score_wgmma_pairs_kernel<128, true>"
    assert (_jit.query_instance("score_wgmma_pairs_kernel<128, true>", "float16")
            == "score_wgmma_pairs_kernel<128, true, half_bits>")
    assert _jit.query_instance("score_ws_kernel<128>", "bfloat16") == "score_ws_kernel<128, bf16_bits>"
    # a defaulted argument left out would take the element type in its place
    with pytest.raises(ValueError, match="score_wgmma_pairs_kernel<128>"):
        _jit.query_instance("score_wgmma_pairs_kernel<128>", "bfloat16")
    with pytest.raises(ValueError, match="score_mma_kernel"):
        _jit.query_instance("score_mma_kernel<128, 8>", "float16")
    # every 16-bit query instance the table compiles is one of these names (key_write.cu's
    # element types are the keys', not the query's)
    typed = [n for src, names in _jit.INSTANCES.items() if src != "key_write.cu"
             for n in names if n.endswith(("half_bits>", "bf16_bits>"))]
    assert len(typed) == 96
