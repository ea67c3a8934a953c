"""scripts/ab_kernels.py's host side (CPU): the versions it compiles and its arguments."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("ab_kernels", ROOT / "scripts" / "ab_kernels.py")
ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab)


def _in_git_checkout():
    if shutil.which("git") is None:
        return False
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    return done.returncode == 0


def _local_includes(text):
    return [line for line in text.splitlines() if line.startswith('#include "')]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_revision_is_compiled_with_its_own_headers(tmp_path):
    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "score_x.cu").write_text('#include "h.cuh"\n__global__ void score_x_kernel() {}\n')
    (repo / "kernels" / "h.cuh").write_text("#pragma once\n// REV ONE\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "kernels"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    (repo / "kernels" / "h.cuh").write_text("#pragma once\n// REV TWO\n")  # the working tree moves on
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    text = ab.version_text("HEAD", "score_x.cu", scratch, root=repo)
    assert "score_x_kernel" in text and "// REV ONE" in text and "REV TWO" not in text
    assert not _local_includes(text) and "#pragma once" not in text


@pytest.mark.skipif(not _in_git_checkout(), reason="needs git and a checkout")
def test_this_repositorys_head_inlines_every_header(tmp_path):
    text = ab.version_text("HEAD", "score_ks.cu", tmp_path)
    assert "score_ks_kernel" in text and "// ---- begin wgmma_common.cuh" in text and not _local_includes(text)


def test_a_file_is_compiled_with_the_working_trees_headers(tmp_path):
    variant = tmp_path / "mine.cu"
    source = (ROOT / "kernels" / "score_dense.cu").read_text()
    variant.write_text(source.replace("constexpr int kStages = 4;", "constexpr int kStages = 4;  // a variant"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    text = ab.version_text(str(variant), "score_dense.cu", scratch)
    assert "// a variant" in text
    assert "// ---- begin wgmma_common.cuh" in text and not _local_includes(text)
    # the working tree's header: its longest line among the text
    header = (ROOT / "kernels" / "wgmma_common.cuh").read_text().splitlines()
    assert max(header, key=len) in text


def test_neither_file_nor_revision_is_refused_naming_the_option(tmp_path):
    if not _in_git_checkout():
        pytest.skip("needs git and a checkout")
    with pytest.raises(ValueError, match="--against"):
        ab.version_text("no-such-revision-or-file", "score_ks.cu", tmp_path)


def test_unknown_source_and_bad_counts_are_refused(capsys):
    with pytest.raises(SystemExit):
        ab.parse_args(["--source", "score_nothing.cu", "--case", "prefill-8K", "--against", "HEAD"])
    assert "--source" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab.parse_args(["--source", "score_ks.cu", "--case", "prefill-8K", "--against", "HEAD", "--rounds", "0"])
    assert "--rounds" in capsys.readouterr().err
    args = ab.parse_args(["--source", "score_ks.cu", "--case", "prefill-chunk", "--against", "HEAD",
                          "--against", "x.cu"])
    assert args.against == ["HEAD", "x.cu"] and args.rounds == 4 and args.fast_kernel == "auto"
    # the select kernels' source is swappable too; a header is not
    assert ab.parse_args(["--source", "select_fast.cu", "--case", "prefill-8K", "--against", "HEAD"]).source == \
        "select_fast.cu"
    with pytest.raises(SystemExit):
        ab.parse_args(["--source", "select_row.cuh", "--case", "prefill-8K", "--against", "HEAD"])


def test_the_select_source_it_swaps_is_the_one_the_launches_read():
    # cuda_ops imports CuPy, so its text is read: every select launch through _SELECT_SOURCE
    text = (ROOT / "indexer" / "cuda_ops.py").read_text()
    assert f'_SELECT_SOURCE = "{ab.SELECT_SOURCE}"' in text
    assert '_kernel("select_fast.cu"' not in text and text.count("_kernel(_SELECT_SOURCE") >= 8


def test_without_a_gpu_or_with_an_unknown_case_it_says_so_in_one_line(capsys):
    assert ab.main(["--source", "score_ks.cu", "--case", "no-such-case", "--against", "HEAD"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--case: unknown case 'no-such-case'" in err


def test_save_writes_each_version_inlined_for_a_checkout_without_history(tmp_path, capsys):
    if not _in_git_checkout():
        pytest.skip("needs git and a checkout")
    assert ab.main(["--source", "select_fast.cu", "--against", "HEAD", "--save", str(tmp_path / "v")]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == tmp_path / "v" / "select_fast@HEAD.cu" and path.is_file()
    text = path.read_text()
    assert not _local_includes(text) and "topk_row_kernel" in text
    # the saved file is a version as --against takes one: its text comes back unchanged
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert ab.version_text(str(path), "select_fast.cu", scratch) == text


def test_save_refuses_an_unknown_revision_in_one_line(tmp_path, capsys):
    if not _in_git_checkout():
        pytest.skip("needs git and a checkout")
    assert ab.main(["--source", "score_ks.cu", "--against", "no-such-rev", "--save", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--against" in err


def test_case_is_required_unless_saving(capsys):
    with pytest.raises(SystemExit):
        ab.parse_args(["--source", "score_ks.cu", "--against", "HEAD"])
    assert "--case" in capsys.readouterr().err
    assert ab.parse_args(["--source", "score_ks.cu", "--against", "HEAD", "--save", "x"]).case is None
