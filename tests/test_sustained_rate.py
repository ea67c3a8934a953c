"""scripts/sustained_rate.py's power floor (CPU): the arithmetic of docs/performance.md v37."""

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "sustained_rate", Path(__file__).resolve().parent.parent / "scripts" / "sustained_rate.py")
sustained = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sustained)

# the H200 of v37: cap 700 W, GEMM 611 TFLOP/s at 692 W, reads 4.53 TB/s at 699 W, idle SMs 241 W
MEASURED = dict(gemm_rate=611e12, gemm_watts=692.0, read_bw=4.53e12, read_watts=699.0, idle_watts=241.0,
                cap_watts=700.0)


def floor(flops, nbytes, **over):
    return sustained.power_floor_seconds(flops, nbytes, **{**MEASURED, **over})


def test_the_floor_is_its_two_terms():
    total, t_gemm, t_read = floor(275e9, 1.21e9)
    assert total == pytest.approx(t_gemm + t_read)
    assert t_gemm > 0 and t_read > 0


def test_a_gemm_at_the_cap_costs_its_own_time():
    _, t_gemm, _ = floor(275e9, 0, gemm_watts=700.0)
    assert t_gemm == pytest.approx(275e9 / 611e12)


def test_reads_at_the_cap_cost_their_own_time_and_free_reads_nothing():
    _, _, t_read = floor(0, 1.21e9, read_watts=700.0)
    assert t_read == pytest.approx(1.21e9 / 4.53e12)
    assert floor(0, 1.21e9, read_watts=241.0)[2] == 0.0


def test_terms_grow_with_the_work():
    a, b = floor(275e9, 1.21e9), floor(2 * 275e9, 3 * 1.21e9)
    assert b[1] == pytest.approx(2 * a[1]) and b[2] == pytest.approx(3 * a[2])


def test_a_larger_idle_power_gives_a_smaller_read_term():
    # the docstring's claim: P0 measured at full clock (larger) errs low
    assert floor(0, 1.21e9, idle_watts=300.0)[2] < floor(0, 1.21e9, idle_watts=150.0)[2]


def test_shares_kept_side_by_side_and_sharing_one_budget():
    # the burst measurement of v63 (ms): each kept 0.95 of its alone-rate, summing 1.90
    k_first, k_second, total = sustained.shares_kept(1.406, 0.591, 1.485, 0.619)
    assert k_first == pytest.approx(1.406 / 1.485) and k_second == pytest.approx(0.591 / 0.619)
    assert total == pytest.approx(1.90, abs=0.01)
    # no interplay: each as fast together as alone; one shared budget: each at half its rate
    assert sustained.shares_kept(2.0, 1.0, 2.0, 1.0)[2] == pytest.approx(2.0)
    assert sustained.shares_kept(2.0, 1.0, 4.0, 2.0)[2] == pytest.approx(1.0)
