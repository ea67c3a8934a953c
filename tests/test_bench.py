"""The benchmark module (CPU only): case layouts, counts, the floor, selection, the output
lines and the run's orchestration with the device side replaced by fakes."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from indexer import arrays, bench

H, D = 64, 128
BY_NAME = {c.name: c for c in bench.CASES}


def ceil_div(a, b):
    return -(-np.asarray(a) // b)


# ----------------------------------------------------------------------------- import


def test_import_needs_no_cupy_or_torch():
    code = ("import sys, indexer.bench; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'torch', 'indexer')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    mods = eval(out)  # noqa: S307  (our own output)
    assert "indexer.bench" in mods
    assert not [m for m in mods if not m.startswith("indexer")], mods
    assert "indexer.cuda_ops" not in mods


# ----------------------------------------------------------------------------- case_layout


@pytest.fixture(scope="module")
def layouts():
    return {c.name: bench.case_layout(c, seed=100 + i) for i, c in enumerate(bench.CASES)}


def test_case_table_names():
    assert [c.name for c in bench.CASES] == ["decode-1M", "decode-128K", "decode-latency", "decode-ragged",
                                             "decode-E256", "mtp-2", "mtp-3", "mtp-4", "prefill-8K", "prefill-chunk"]


@pytest.mark.parametrize("name", list(BY_NAME))
def test_case_layout_shapes_and_block_table(layouts, name):
    case, lay = BY_NAME[name], layouts[name]
    c = lay["counts"]
    seq_lens, lens, table = lay["seq_lens"], lay["valid_lens"], lay["block_table"]
    T = case.seqs * case.queries_per_seq
    blocks = ceil_div(seq_lens, case.E)
    assert c["T"] == T
    assert c["P"] == int(blocks.sum()) and c["L"] == int(blocks.max())
    assert seq_lens.shape == (case.seqs,)
    assert lens.shape == (T,) and lens.dtype == np.int32
    assert table.shape == (T, c["L"]) and table.dtype == np.int32
    assert table.flags.c_contiguous
    assert lens.min() >= 0 and lens.max() <= c["L"] * case.E
    # the queries of one sequence share its row; a query sees no more than its sequence holds
    per_seq = T // len(seq_lens)
    rows = table.reshape(len(seq_lens), per_seq, c["L"])
    assert (rows == rows[:, :1]).all()
    assert (lens.reshape(len(seq_lens), per_seq) <= seq_lens[:, None]).all()
    # visible blocks: in [0, P), distinct within a sequence and across sequences (one
    # permutation of the pool); -1 past a sequence's last block
    visible = np.arange(c["L"])[None, :] < blocks[:, None]
    ids = rows[:, 0][visible]
    assert ids.min() >= 0 and ids.max() < c["P"]
    assert np.array_equal(np.sort(ids), np.arange(c["P"]))
    assert (rows[:, 0][~visible] == -1).all()
    assert not np.array_equal(ids, np.arange(c["P"]))  # permuted, not in order


@pytest.mark.parametrize("name", list(BY_NAME))
def test_case_layout_counts(layouts, name):
    case, lay = BY_NAME[name], layouts[name]
    c, lens, seq_lens = lay["counts"], lay["valid_lens"], lay["seq_lens"]
    T = c["T"]
    assert c["pairs"] == int(lens.astype(np.int64).sum())
    assert c["flops"] == 2 * 64 * 128 * c["pairs"]
    keys = int(seq_lens.sum()) * (D // 2 + D // 16) + c["P"] * 4  # once per sequence
    io = T * H * D * 4 + T * H * 4 + T * case.top_k * 4
    assert c["bytes"] == keys + io


def test_case_layout_lengths_per_kind(layouts):
    for name in ("decode-1M", "decode-latency"):
        assert (layouts[name]["valid_lens"] == 262_144).all()
    assert (layouts["decode-128K"]["valid_lens"] == 32_768).all()
    assert (layouts["decode-E256"]["valid_lens"] == 65_536).all() and layouts["decode-E256"]["counts"]["L"] == 256
    ragged = layouts["decode-ragged"]["valid_lens"]
    assert ragged.min() >= 1 and ragged.max() <= 262_144 and len(np.unique(ragged)) > 32
    assert np.array_equal(ragged, layouts["decode-ragged"]["seq_lens"])
    mtp = layouts["mtp-2"]
    assert np.array_equal(mtp["valid_lens"].reshape(64, 2), np.tile([65_536, 65_537], (64, 1)))
    assert (mtp["seq_lens"] == 65_537).all()
    assert np.array_equal(mtp["block_table"][0::2], mtp["block_table"][1::2])
    for n in (3, 4):  # rows n b .. n b + n - 1 of request b, one more entry each, one block-table row
        lay = layouts[f"mtp-{n}"]
        assert np.array_equal(lay["valid_lens"].reshape(64, n), np.tile(65_536 + np.arange(n), (64, 1)))
        assert (lay["seq_lens"] == 65_535 + n).all()
        assert lay["cu_seqlens"].tolist() == list(range(0, 64 * n + 1, n))
        assert all(np.array_equal(lay["block_table"][i::n], lay["block_table"][0::n]) for i in range(1, n))
    t = np.arange(8192)
    assert np.array_equal(layouts["prefill-8K"]["valid_lens"], (t + 1) // 4)
    assert layouts["prefill-8K"]["seq_lens"].tolist() == [2048]
    t = np.arange(4096)
    assert np.array_equal(layouts["prefill-chunk"]["valid_lens"], 262_144 + (t + 1) // 4)
    assert layouts["prefill-chunk"]["seq_lens"].tolist() == [262_144 + 1024]
    assert layouts["prefill-chunk"]["counts"]["L"] == 4112


def test_shared_keys_are_counted_once(layouts):
    # mtp-2: 64 sequences of 65,537 keys, not 128 queries' worth
    mtp = layouts["mtp-2"]["counts"]
    assert mtp["bytes"] == 64 * 65_537 * 72 + 64 * 1025 * 4 + 128 * (H * D * 4 + H * 4 + 1024 * 4)
    # prefill: one sequence of 263,168 keys read by 4,096 queries
    pre = layouts["prefill-chunk"]["counts"]
    assert pre["bytes"] == 263_168 * 72 + 4112 * 4 + 4096 * (H * D * 4 + H * 4 + 1024 * 4)
    assert pre["pairs"] * 72 > 400 * pre["bytes"]


def test_case_layout_is_reproducible():
    case = BY_NAME["decode-ragged"]
    a, b, c = bench.case_layout(case, 5), bench.case_layout(case, 5), bench.case_layout(case, 6)
    assert np.array_equal(a["block_table"], b["block_table"]) and np.array_equal(a["valid_lens"], b["valid_lens"])
    assert not np.array_equal(a["valid_lens"], c["valid_lens"])


# ----------------------------------------------------------------------------- floor


def test_floor_decode_128k_matches_the_docs():
    c = bench.case_layout(BY_NAME["decode-128K"], 0)["counts"]
    flops = 2 * 64 * 128 * 128 * 32_768
    nbytes = 128 * 32_768 * (64 + 8) + 128 * 512 * 4 + 128 * 64 * 128 * 4 + 128 * 64 * 4 + 128 * 512 * 4
    assert (c["flops"], c["bytes"]) == (flops, nbytes)
    floor = bench.floor_seconds(c, 4.24e12, 780e12)
    assert floor == max(nbytes / 4.24e12, flops / 780e12) == flops / 780e12  # compute-bound
    assert floor * 1e3 == pytest.approx(0.088, rel=0.05)


def test_floor_bandwidth_bound():
    assert bench.floor_seconds({"bytes": 4e9, "flops": 1e9}, 2e12, 1e15) == 2e-3


def test_rotation_sets():
    assert bench.rotation_sets(1 << 30) == 1
    assert bench.rotation_sets(100 << 20) == 1
    assert bench.rotation_sets(70 << 20) == 2
    assert bench.rotation_sets(1 << 20) == 4
    assert bench.rotation_sets(0) == 4


# ----------------------------------------------------------------------------- selection


def test_select_cases():
    assert [c.name for c in bench.select_cases("all")] == [c.name for c in bench.CASES]
    assert [c.name for c in bench.select_cases(bench.DEFAULT_CASES)] == bench.DEFAULT_CASES.split(",")
    # the table's order, once each
    assert [c.name for c in bench.select_cases("mtp-2,decode-1M,mtp-2")] == ["decode-1M", "mtp-2"]
    with pytest.raises(ValueError, match=r"unknown case 'nope'.*known: decode-1M, .*prefill-chunk"):
        bench.select_cases("decode-1M,nope")
    assert [c.name for c in bench.select_cases("decode-1M,nope", strict=False)] == ["decode-1M"]


def test_cases_of_ones_own_shape():
    # KIND-BxN[-kK][-EE]: the table's cases first, then the caller's in the order given, once each
    cases = bench.select_cases("decode-8x131072-k512,mtp-2,mtp3-16x65536,ragged-32x262144-E256,decode-8x131072-k512")
    assert [c.name for c in cases] == ["mtp-2", "decode-8x131072-k512", "mtp3-16x65536", "ragged-32x262144-E256"]
    decode, mtp, ragged = cases[1:]
    assert (decode.kind, decode.seqs, decode.queries_per_seq, decode.entries, decode.top_k, decode.E) == (
        "decode", 8, 1, 131072, 512, 64)
    assert (mtp.kind, mtp.seqs, mtp.queries_per_seq, mtp.entries, mtp.top_k, mtp.E) == ("mtp", 16, 3, 65536, 1024, 64)
    assert (ragged.kind, ragged.seqs, ragged.entries, ragged.E) == ("ragged", 32, 262144, 256)
    # a custom case lays out as the table's case of the same shape does
    same = bench.case_layout(bench.custom_case("decode-64x262144"), 5)
    table = bench.case_layout(next(c for c in bench.CASES if c.name == "decode-1M"), 5)
    assert same["counts"] == table["counts"]
    np.testing.assert_array_equal(same["block_table"], table["block_table"])
    small = bench.case_layout(bench.custom_case("mtp3-4x1000-k16-E16"), 0)
    assert small["counts"]["T"] == 12 and small["block_table"].shape == (12, -(-1002 // 16))
    np.testing.assert_array_equal(small["cu_seqlens"], [0, 3, 6, 9, 12])
    # a name of the form with numbers out of range says which
    for name, why in [("decode-0x10", "B >= 1"), ("mtp1-4x100", "Q >= 2"), ("decode-4x99999999", "N <="),
                      ("decode-4096x4194304", "B x Q x N"), ("decode-268435456x1", "B x Q <= 65536"),
                      ("mtp65536-4096x1", "B x Q <="), ("decode-4x100-k5000", "K <= 4096"),
                      ("decode-4x100-E0", "1 <= E")]:
        with pytest.raises(ValueError, match=f"--cases: '{name}' needs .*{re.escape(why)}"):
            bench.select_cases(name)
        with pytest.raises(ValueError, match=f"--cases: '{name}' needs"):  # whether strict or not
            bench.select_cases(name, strict=False)
    # other forms are unknown names, the form named in the message (numbers of ten digits
    # or more among them, never Python's own int-conversion error)
    for name in ("decode-4x100-k12-E3x", "prefill-4x100", "decode-4X100", "decode-4x100-E16-k8",
                 "decode-4x" + "9" * 5000, "decode-1234567890x4"):
        with pytest.raises(ValueError, match=r"unknown case .*a case of your own: KIND-BxN"):
            bench.select_cases(name)
    assert bench.custom_case("decode-1M") is None


def test_select_paths():
    assert bench.select_paths(bench.DEFAULT_PATHS) == ["fast", "fast-score", "exact", "torch-composed", "torch-topk"]
    assert bench.select_paths("torch-topk,fast-mma") == ["torch-topk", "fast-mma"]
    assert bench.select_paths("prepared,fast") == ["prepared", "fast"]
    with pytest.raises(ValueError, match=r"unknown path 'slow'.*known: fast, "):
        bench.select_paths("fast,slow")


def test_float8_paths_say_they_need_pytorch_where_it_is_missing():
    assert bench.select_paths("fast-f8,fast-f8-score") == ["fast-f8", "fast-f8-score"]
    said = []
    case = bench.select_cases("decode-latency")[0]
    # before anything touches CuPy or the GPU: no PyTorch, no float8 query to give the kernels
    got = bench.measure("fast-f8-score", case, {"T": 1}, [{"q": None}], (None, None, None), 3, echo=said.append)
    assert got == (None, 0.0, None)
    assert said == ["  (fast-f8-score needs PyTorch for its float8_e4m3fn query)"]


# ----------------------------------------------------------------------------- lines


def test_path_numbers_and_format_line():
    counts = {"flops": 2e12, "bytes": 4e9}
    line = bench.path_numbers(2.0, 1.5, counts, 1e-3)
    assert line == {"ms": 2.0, "x_floor": 2.0, "tflops": 1000.0, "gbs": 2000.0, "extra_mb": 1.5}
    text = bench.format_line("decode-128K", "fast (graph)", line, 20.0)
    assert text == (f"{'decode-128K':15s} {'fast (graph)':20s} {2.0:9.4f} {2.0:8.2f} {1000.0:8.1f} "
                    f"{2000.0:8.0f} {1.5:9.1f} {'10.0x':>8s}")
    assert text.endswith("   10.0x")
    assert bench.format_line("x", "torch-composed", line, 2.0).endswith(" " * 8)
    assert bench.format_line("x", "fast", line, None).endswith(" " * 8)
    assert len(bench.HEADER) == len(text)


# ----------------------------------------------------------------------------- run and main


def test_require_gpu_returns_cupy(monkeypatch):
    sentinel = object()
    monkeypatch.setattr(arrays, "cupy", lambda: sentinel)
    assert bench.require_gpu() is sentinel


def test_run_without_gpu(monkeypatch):
    monkeypatch.setattr(arrays, "cupy", lambda: None)
    with pytest.raises(RuntimeError, match="^bench: needs CuPy and a CUDA GPU$") as info:
        bench.run(["decode-128K"], ["fast"])
    assert isinstance(info.value, bench.GPUUnavailable)


@pytest.fixture
def fake_device(monkeypatch):
    """The device side replaced: 4 TB/s, 800 TFLOP/s; fast 0.5 ms eager, 0.4 ms in a graph,
    torch-composed 10 ms, torch-topk not available (no PyTorch)."""
    calls = {"measure": [], "freed": 0}
    fake_cp = object()
    monkeypatch.setattr(bench, "require_gpu", lambda: fake_cp)
    monkeypatch.setattr(bench, "_gpu_modules", lambda: (fake_cp, None, None))
    monkeypatch.setattr(bench, "ceilings", lambda cp: (4e12, 800e12))
    monkeypatch.setattr(bench, "device_name", lambda cp: "Fake GPU")

    def input_sets(case, cp, index):
        return [{}], bench.case_layout(case, 100 + index)["counts"]

    def measure(path, case, counts, sets, mods, repeats, echo=print):
        calls["measure"].append((case.name, path, repeats))
        return {"fast": (0.5, 12.0, 0.4), "torch-composed": (10.0, 0.0, None)}.get(path, (None, 0.0, None))

    def free(cp):
        calls["freed"] += 1

    monkeypatch.setattr(bench, "input_sets", input_sets)
    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "free_device_memory", free)
    return calls


def test_run_takes_a_case_of_ones_own_shape_by_name(fake_device):
    lines = []
    res = bench.run(["decode-128K", "decode-2x5000-k64-E32"], ["fast"], 3, echo=lines.append)
    # the case column widened to the longest name, every line aligned with the header
    assert lines[1] == bench.header(len("decode-2x5000-k64-E32")) and len(lines[1]) == len(bench.HEADER) + 6
    assert [len(ln) for ln in lines[2:] if " floor " not in ln] == [len(lines[1])] * 4
    assert lines[2].startswith("decode-128K" + " " * 11 + "fast")
    fake_device["measure"] = fake_device["measure"][1:]
    assert fake_device["measure"] == [("decode-2x5000-k64-E32", "fast", 3)]
    counts = bench.case_layout(bench.custom_case("decode-2x5000-k64-E32"), 100)["counts"]
    assert res["cases"][1]["case"] == "decode-2x5000-k64-E32" and res["cases"][1]["T"] == counts["T"] == 2
    assert res["cases"][1]["L"] == -(-5000 // 32)
    # through the Python API the errors name run's own argument
    with pytest.raises(ValueError, match="^cases: 'decode-2x5000-k0' needs 1 <= K <= 4096"):
        bench.run(["decode-2x5000-k0"], ["fast"])
    with pytest.raises(ValueError, match=r"^cases: unknown case 'nope' .*a case of your own: KIND-BxN"):
        bench.run(["nope"], ["fast"])


def test_run_rows_lines_progress_and_json(fake_device, tmp_path):
    lines, ticks = [], []
    out = tmp_path / "bench.json"
    res = bench.run(["decode-128K", bench.CASES[5]], ["fast", "torch-composed", "torch-topk"], 7,
                    json_path=out, progress=lambda c, p: ticks.append((c, p)), echo=lines.append)
    assert ticks == [(c, p) for c in ("decode-128K", "mtp-2") for p in ("fast", "torch-composed", "torch-topk")]
    assert fake_device["measure"] == [t + (7,) for t in ticks]
    assert fake_device["freed"] == 2
    assert lines[0].startswith("# Fake GPU  ") and lines[0].endswith("copy 4.00 TB/s  fp16 tensor 800 TFLOP/s")
    assert lines[1] == bench.HEADER
    assert [ln.split()[:2] for ln in lines[2:]] == [
        ["decode-128K", "fast"], ["decode-128K", "fast"], ["decode-128K", "torch-composed"], ["decode-128K", "floor"],
        ["mtp-2", "fast"], ["mtp-2", "fast"], ["mtp-2", "torch-composed"], ["mtp-2", "floor"]]
    assert lines[3].split()[2] == "(graph)" and lines[3].endswith("25.0x") and lines[2].endswith("20.0x")
    assert res["device"] == "Fake GPU" and res["copy_bw"] == 4e12 and res["tensor_rate"] == 800e12
    assert json.loads(out.read_text()) == res
    row = res["cases"][0]
    counts = bench.case_layout(bench.CASES[1], 100)["counts"]
    floor = bench.floor_seconds(counts, 4e12, 800e12)
    assert row["case"] == "decode-128K" and row["floor_ms"] == pytest.approx(floor * 1e3)
    assert {k: row[k] for k in counts} == counts
    assert list(row["paths"]) == ["fast", "fast (graph)", "torch-composed"]
    fast = row["paths"]["fast"]
    assert fast["ms"] == 0.5 and fast["extra_mb"] == 12.0 and fast["vs_torch"] == 20.0
    assert fast["x_floor"] == pytest.approx(0.5e-3 / floor)
    assert fast["tflops"] == pytest.approx(counts["flops"] / 0.5e-3 / 1e12)
    assert fast["gbs"] == pytest.approx(counts["bytes"] / 0.5e-3 / 1e9)
    assert row["paths"]["fast (graph)"]["ms"] == 0.4 and row["paths"]["fast (graph)"]["vs_torch"] == 25.0
    assert row["paths"]["torch-composed"]["vs_torch"] == 1.0
    assert lines[5] == f"{'decode-128K':15s} {'floor':20s} {floor * 1e3:9.4f}"


def test_run_prints_by_default_and_no_torch_means_no_speedup(fake_device, capsys):
    res = bench.run([bench.CASES[2]], ["fast"], 3)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == bench.HEADER and len(out) == 5
    assert out[2].split()[:2] == ["decode-latency", "fast"] and out[2].endswith(" " * 8)
    assert res["cases"][0]["paths"]["fast"]["vs_torch"] is None


def test_main_without_gpu(monkeypatch, capsys):
    monkeypatch.setattr(arrays, "cupy", lambda: None)
    assert bench.main(["--cases", "decode-128K", "--paths", "fast"]) == 2
    assert capsys.readouterr().out == "bench: needs CuPy and a CUDA GPU\n"


def test_main_arguments(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(bench, "require_gpu", lambda: None)
    monkeypatch.setattr(bench, "run", lambda *a, **k: seen.update(args=a, kwargs=k))
    out = str(tmp_path / "o.json")
    assert bench.main(["--cases", "mtp-2,decode-1M,bogus", "--paths", "fast,exact", "--repeats", "3",
                       "--json", out]) == 0
    cases, paths, repeats = seen["args"]
    assert [c.name for c in cases] == ["decode-1M", "mtp-2"]  # unknown names ignored, as ever
    assert (paths, repeats, seen["kwargs"]) == (["fast", "exact"], 3, {"json_path": out})
    assert bench.main([]) == 0
    cases, paths, repeats = seen["args"]
    assert [c.name for c in cases] == bench.DEFAULT_CASES.split(",")
    assert (",".join(paths), repeats, seen["kwargs"]) == (bench.DEFAULT_PATHS, 20, {"json_path": None})


def _row(case, **ms):
    """A case's results as run() records them: path -> milliseconds (x floor: ms / 0.1)."""
    names = {"graph": "fast (graph)", "score": "fast-score (graph)", "eager": "fast",
             "exact": "exact (graph)", "torch": "torch-composed"}
    return dict(case=case, paths={names[k]: dict(ms=v, x_floor=v / 0.1) for k, v in ms.items()})


def test_markdown_table_rows_as_readme_writes_them():
    new = dict(cases=[_row("decode-1M", graph=0.6342, score=0.6436, eager=0.7912, torch=55.41),
                      _row("decode-latency", graph=0.02441, score=0.01924, eager=0.0851, torch=1.2209),
                      _row("my-case", graph=29.63, torch=579.4)])
    old = dict(cases=[_row("decode-1M", exact=11.31), _row("my-case", exact=741.2)])
    lines = bench.markdown_table(new, old).splitlines()
    assert lines[0].startswith("| case | fast (graph) | x floor |") and set(lines[1]) <= set("|- ")
    assert lines[2] == ("| decode-1M (B 64, 262,144 entries, k 1024) | 0.634 ms | 6.34 | 0.644 ms | 0.791 ms "
                        "| 11.3 ms | 55.4 ms | 87x |")
    assert lines[3] == ("| decode-latency (B 1, 262,144, k 1024) | 0.0244 ms | 0.24 | 0.0192 ms | 0.0851 ms "
                        "|  | 1.22 ms | 50x |")  # no exact run of it: an empty cell
    assert lines[4] == "| my-case | 29.6 ms | 296.30 |  |  | 741 ms | 579 ms | 20x |"
    # this run's exact column wins over the older run's
    new["cases"][0]["paths"]["exact (graph)"] = dict(ms=10.04, x_floor=100.4)
    assert "| 10 ms |" in bench.markdown_table(new, old).splitlines()[2]


def test_bench_table_script(tmp_path):
    new = dict(device="H200", date="2026-12-04", copy_bw=4.13e12, tensor_rate=749e12,
               cases=[_row("mtp-2", graph=0.2822, score=0.2631, eager=0.345, torch=18.6)])
    old = dict(cases=[_row("mtp-2", exact=5.81)])
    (tmp_path / "new.json").write_text(json.dumps(new))
    (tmp_path / "old.json").write_text(json.dumps(old))
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_table.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "new.json"), "--exact-from",
                          str(tmp_path / "old.json")], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "<!-- H200 2026-12-04: copy 4.13 TB/s, fp16 tensor 749 TFLOP/s -->"
    assert out[3] == "| mtp-2 (B 64 x 2, 65,536) | 0.282 ms | 2.82 | 0.263 ms | 0.345 ms | 5.81 ms | 18.6 ms | 66x |"
