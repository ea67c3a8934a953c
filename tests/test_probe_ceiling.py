"""scripts/probe_ceiling.py's host side: the hot-pool block table (CPU)."""

import importlib.util
from pathlib import Path

import numpy as np

_SPEC = importlib.util.spec_from_file_location(
    "probe_ceiling", Path(__file__).resolve().parent.parent / "scripts" / "probe_ceiling.py")
probe = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(probe)


def test_folded_table_keeps_padding_and_stays_in_the_hot_blocks():
    rng = np.random.default_rng(3)
    table = rng.permutation(4096).astype(np.int32).reshape(16, 256)
    table[3, 200:] = -1
    table[7, :] = -1
    folded = probe.fold_block_table(table, 64)
    assert folded.dtype == np.int32 and folded.shape == table.shape
    np.testing.assert_array_equal(folded < 0, table < 0)
    assert np.all(folded[folded < 0] == -1)
    visible = table >= 0
    np.testing.assert_array_equal(folded[visible], table[visible] % 64)
    assert folded.max() < 64
