"""Launch geometry is pure: checked on the CPU against the kernels' constraints."""

import re
from pathlib import Path

import pytest

from indexer import geometry
from indexer.geometry import H200, Device


@pytest.mark.parametrize("H,groups", [(1, 1), (8, 1), (9, 2), (16, 2), (17, 4), (64, 8), (65, 16), (128, 16)])
def test_head_groups_cover_the_heads(H, groups):
    assert geometry.head_groups(H) == groups
    assert 8 * geometry.head_groups(H) >= H
    assert geometry.mma_head_blocks(H) == max(2, groups)


def test_more_than_128_heads_is_refused():
    with pytest.raises(ValueError, match="q: at most 128 heads"):
        geometry.head_groups(129)


@pytest.mark.parametrize("launch", [geometry.score_fp32_launch, geometry.score_mma_launch])
@pytest.mark.parametrize("T,max_len", [(1, 1), (1, 262_144), (64, 262_144), (128, 32_768), (8192, 2048), (3, 129)])
def test_score_launch_covers_every_tile_once(launch, T, max_len):
    sl = launch(T, 64, 128, max_len)
    tiles = geometry.tiles_per_row(max_len)
    assert sl.grid[0] == T
    assert sl.grid[1] * sl.tiles_per_cta >= tiles > (sl.grid[1] - 1) * sl.tiles_per_cta
    assert sl.grid[1] <= 65535
    assert sl.ld == tiles * geometry.TILE_ENTRIES and sl.ld >= max_len
    assert 0 < sl.smem <= H200.max_smem_per_block


def test_one_long_row_spreads_over_the_chip():
    sl = geometry.score_mma_launch(1, 64, 128, 262_144)
    assert sl.grid[0] * sl.grid[1] >= H200.sm_count


@pytest.mark.parametrize("D", range(32, 257, 32))
def test_mma_instances_exist_for_every_supported_shape(D):
    from indexer import _jit

    for H in (1, 16, 64, 128):
        for launch, source in ((geometry.score_mma_launch, "score_mma.cu"), (geometry.score_fp32_launch, "score_fp32.cu")):
            assert launch(2, H, D, 1000).name in _jit.INSTANCES[source]


def test_shared_memory_limit_is_enforced():
    small = Device(sm_count=10, max_smem_per_block=48 * 1024, compute_capability=80)
    with pytest.raises(ValueError, match="shared memory"):
        geometry.score_mma_launch(1, 128, 256, 100, small)
    with pytest.raises(ValueError, match="shared memory"):
        geometry.score_fp32_launch(1, 128, 256, 100, small)


def test_workspace_rows_respect_the_budget():
    ld = 262_144
    rows = geometry.workspace_rows(64, ld, budget_bytes=32 << 20)
    assert rows * geometry.workspace_row_bytes(ld) <= 32 << 20 or rows == 1
    assert geometry.workspace_rows(64, ld, budget_bytes=1) == 1
    assert geometry.workspace_rows(3, 128) == 3
    # decode-1M (64 rows of 262,144 entries) under the default 64 MB: two even runs of 32
    q_bytes = 64 * 136 * 2 + 64 * 4
    rows = geometry.workspace_rows(64, ld, query_bytes=q_bytes)
    assert rows == 32 and rows * geometry.workspace_row_bytes(ld, q_bytes) <= geometry.DEFAULT_WORKSPACE_BYTES
    # runs are even: 10 rows that fit 4 at a time run as 4 + 4 + 2, 9 as 3 x 3 (no tail of 1)
    per = geometry.workspace_row_bytes(128)
    assert geometry.workspace_rows(10, 128, budget_bytes=4 * per) == 4
    # a huge budget still keeps a run within a grid's y limit (rows are the select's y axis)
    assert geometry.workspace_rows(200_000, 128, budget_bytes=1 << 40) <= geometry.MAX_GRID_Y
    # prefill-8K's rows through the pair kernel: 8 runs of 1,024 instead of 4 of 2,048
    q_bytes = 64 * 136 * 2 + 64 * 4
    assert geometry.workspace_rows(8192, 2048, query_bytes=q_bytes, row_select=True,
                                   max_rows=geometry.MAX_BALANCED_ROWS) == 1024
    assert geometry.workspace_rows(8192, 2048, query_bytes=q_bytes, row_select=True) == 2048
    assert geometry.workspace_rows(9, 128, budget_bytes=4 * per) == 3
    assert geometry.select_fast_chunks(1) == 1
    assert geometry.select_fast_chunks(geometry.SELECT_CHUNK + 1) == 2
    # one long row: 4 entries a thread, 256 CTAs instead of 64; a decode batch keeps 16
    assert geometry.select_fast_per_thread(1, 262_144) == 4
    assert geometry.select_fast_chunks(262_144, 4) == 256
    assert geometry.select_fast_per_thread(32, 262_144) == 16


@pytest.mark.parametrize("H,D,ok", [(64, 128, True), (1, 32, True), (65, 128, False), (64, 160, False)])
def test_wgmma_covers_hopper_up_to_64_heads_and_d_128(H, D, ok):
    assert geometry.wgmma_supported(H, D) is ok
    ampere = Device(sm_count=108, max_smem_per_block=166912, compute_capability=80)
    assert not geometry.wgmma_supported(H, D, ampere)
    if ok:
        # up to MAX_BALANCED_ROWS rows: one wave of 3 CTAs per SM shares all rows' tiles
        sl = geometry.score_wgmma_launch(64, H, D, 262_144)
        mma = geometry.score_mma_launch(64, 64, D, 262_144)
        assert sl.name == f"score_wgmma_kernel<{D}>" and sl.balanced and sl.grid == (3 * H200.sm_count, 1)
        assert sl.ld == mma.ld
        # three CTAs (plus the 1 KB each reserves) fit the H200's 228 KB of shared memory per SM
        assert 0 < sl.smem and 3 * (sl.smem + 1024) <= 228 * 1024
        assert sl.smem == geometry.wgmma_smem_bytes(D)
        # more rows: runs of tiles per row, as the mma.sync kernel
        many = geometry.MAX_BALANCED_ROWS + 1
        sl = geometry.score_wgmma_launch(many, H, D, 4096)
        mma = geometry.score_mma_launch(many, 64, D, 4096)
        assert not sl.balanced and sl.grid == mma.grid and sl.tiles_per_cta == mma.tiles_per_cta
        from indexer import _jit

        assert sl.name in _jit.INSTANCES["score_wgmma.cu"]
    else:
        with pytest.raises(ValueError, match="wgmma"):
            geometry.score_wgmma_launch(64, H, D, 1000)


@pytest.mark.parametrize("E,D,ok", [(64, 128, True), (2, 128, True), (256, 128, True), (1, 128, False),
                                    (48, 128, False), (8, 96, True), (4, 96, False), (8, 32, True), (4, 32, False)])
def test_wgmma_needs_whole_block_runs_of_16_byte_multiples(E, D, ok):
    # its keys arrive by bulk copies of E (or 128) rows: E a power of two, E * D/16 % 16 == 0
    assert geometry.wgmma_supported(64, D, H200, E) is ok
    if not ok:
        with pytest.raises(ValueError, match="power-of-two E"):
            geometry.score_wgmma_launch(4, 64, D, 1000, E=E)


def test_many_rows_get_about_eight_waves():
    sl = geometry.score_mma_launch(512, 64, 128, 262_144)
    ctas = sl.grid[0] * sl.grid[1]
    assert 6 * 3 * H200.sm_count <= ctas <= 10 * 3 * H200.sm_count


@pytest.mark.parametrize("D", [32, 64, 96, 128])
def test_pair_kernel_keeps_three_ctas_per_sm(D):
    # two queries' B operands and packed histograms, 3-stage ring: 3 CTAs (and the 1 KB each
    # reserves) within the H200's 228 KB per SM
    sl = geometry.score_wgmma_pairs_launch(64, 64, D, 65_536)
    assert sl.name == f"score_wgmma_pairs_kernel<{D}>" and sl.balanced and sl.grid == (3 * H200.sm_count, 1)
    assert sl.smem == geometry.wgmma_pairs_smem_bytes(D) and 3 * (sl.smem + 1024) <= 228 * 1024
    with pytest.raises(ValueError, match="at most"):
        geometry.score_wgmma_pairs_launch(geometry.MAX_PAIR_ROWS + 1, 64, D, 1000)
    with pytest.raises(ValueError, match="power-of-two E"):
        geometry.score_wgmma_pairs_launch(4, 64, D, 1000, E=48)


def test_candidates_are_ranked_only_when_the_rank_grid_fits_two_waves():
    # every decode case ranks (decode-128K: 128 rows, k = 512; mtp-2: 128 rows, k = 1024);
    # runs of many rows with a large k sort
    assert geometry.rank_ctas_per_row(1024) == 8 and geometry.rank_ctas_per_row(1) == 1
    assert geometry.rank_ctas_per_row(4096) == geometry.RANK_MAX // geometry.RANK_GROUP
    assert geometry.rank_select(1, 1024) and geometry.rank_select(32, 1024)
    assert geometry.rank_select(128, 512) and geometry.rank_select(128, 1024)
    assert not geometry.rank_select(256, 1024) and not geometry.rank_select(67, 4096)


def test_the_rank_grid_takes_half_its_ctas_a_row_where_it_would_not_fit_one_wave():
    one_wave = geometry.RANK_CTAS_PER_SM * geometry.H200.sm_count  # 528
    # decode-1M's runs of 32 rows, decode-ragged's 64 (k = 1,024), decode-128K's 128 (k = 512):
    # one wave at a candidate a thread
    for rows, k in ((32, 1024), (64, 1024), (128, 512)):
        assert geometry.rank_ctas_per_row(k, rows) == geometry.rank_ctas_per_row(k) == -(-2 * k // 256)
        assert rows * geometry.rank_ctas_per_row(k, rows) <= one_wave
    # mtp-2's 128 rows at k = 1,024 would need 1,024 CTAs: 4 a row, two candidates a thread
    assert geometry.rank_ctas_per_row(1024, 128) == 4
    assert geometry.rank_ctas_per_row(1024, 67) == 4 and geometry.rank_ctas_per_row(1024, 66) == 8
    assert geometry.rank_ctas_per_row(1, 10_000) == 1
    # which runs rank at all does not move with it
    assert geometry.rank_select(132, 1024) and not geometry.rank_select(133, 1024)


def test_runs_of_an_sms_worth_of_rows_stream_each_row_through_one_cta():
    # mtp-2 and decode-128K (128 rows) stream; decode-1M's runs of 32 rows, decode-ragged's
    # and decode-E256's 64 keep the filter (measured slower streamed); k past RANK_MAX / 4
    # keeps it too, as does a device whose shared memory does not hold the CTA's
    sms = geometry.H200.sm_count  # 132: 99 rows and more
    assert geometry.row_stream_select(128, 1024) and geometry.row_stream_select(128, 512)
    assert geometry.row_stream_select(99, 1024) and not geometry.row_stream_select(98, 1024)
    assert 4 * 99 >= 3 * sms > 4 * 98
    assert not geometry.row_stream_select(64, 1024) and not geometry.row_stream_select(32, 1024)
    assert geometry.row_stream_select(10_000, geometry.RANK_MAX // 4)
    assert not geometry.row_stream_select(10_000, geometry.RANK_MAX // 4 + 1)
    small = geometry.Device(sm_count=132, max_smem_per_block=101_376, compute_capability=89)
    assert not geometry.row_stream_select(128, 512, small)


def test_select_constants_are_the_kernels():
    src = (Path(__file__).resolve().parent.parent / "kernels" / "select_fast.cu").read_text()
    assert int(re.search(r"constexpr int kRankMax = (\d+);", src).group(1)) == geometry.RANK_MAX
    assert int(re.search(r"constexpr int kRankBins = (\d+);", src).group(1)) == geometry.RANK_BINS
    # the streamed select: one fine bin a thread
    assert geometry.RANK_BINS == geometry.ROW_STREAM_THREADS


def test_only_the_fewest_rows_at_a_small_enough_k_rank_every_pair():
    # batch 1 (decode-latency) compares all pairs of its ~1,500 candidates on every SM, as do
    # up to eight rows whose rows x top_k stays small (v104, v105); decode-1M's runs of 32 rows keep
    # the key-bin layout (cnt^2 a row would cost more)
    assert geometry.rank_all_pairs(1, 1024) and geometry.rank_all_pairs(1, 4096)  # one row at any k
    assert geometry.rank_all_pairs(2, 1024) and not geometry.rank_all_pairs(3, 1024)
    assert not geometry.rank_all_pairs(4, 1024)  # four rows ranked faster in fine bins (v104)
    assert geometry.rank_all_pairs(4, 512) and geometry.rank_all_pairs(geometry.RANK_ALL_PAIRS_ROWS, 1)
    assert geometry.rank_all_pairs(8, 256) and not geometry.rank_all_pairs(8, 512)  # eight rows at a small k (v105)
    assert not geometry.rank_all_pairs(2, 2048) and not geometry.rank_all_pairs(32, 1024)
    # more rows keep the bins at any k (not timed: their candidates follow the histogram's bin width)
    assert not geometry.rank_all_pairs(geometry.RANK_ALL_PAIRS_ROWS + 1, 1)
    assert not geometry.rank_all_pairs(16, 128)
    assert geometry.rank_all_pairs_ctas_per_row(1) == geometry.H200.sm_count
    assert geometry.rank_all_pairs_ctas_per_row(4) == geometry.H200.sm_count // 4



@pytest.mark.parametrize("H,D,E,ok", [(64, 128, 64, True), (7, 128, 16, True), (64, 64, 64, False),
                                      (64, 96, 64, False), (64, 128, 48, False), (65, 128, 64, False)])
def test_warp_specialised_kernel_takes_d_128_on_hopper(H, D, E, ok):
    assert geometry.ws_supported(H, D, H200, E) is ok
    ampere = Device(sm_count=108, max_smem_per_block=166912, compute_capability=80)
    assert not geometry.ws_supported(H, D, ampere, E)
    if ok:
        sl = geometry.score_ws_launch(64, H, D, 262_144, E=E)
        assert sl.name == "score_ws_kernel<128>" and sl.balanced and sl.block == (256,)
        assert sl.grid == (2 * H200.sm_count, 1) and sl.ld == geometry.score_wgmma_launch(64, H, D, 262_144).ld
        # two CTAs (plus the 1 KB each reserves) fit the H200's 228 KB of shared memory per SM
        assert sl.smem == geometry.ws_smem_bytes(D) and 2 * (sl.smem + 1024) <= 228 * 1024
        from indexer import _jit

        assert sl.name in _jit.INSTANCES["score_ws.cu"]
        with pytest.raises(ValueError, match="at most 1024 rows"):
            geometry.score_ws_launch(geometry.MAX_BALANCED_ROWS + 1, H, D, 1000, E=E)
    else:
        with pytest.raises(ValueError, match="warp-specialised"):
            geometry.score_ws_launch(4, H, D, 1000, E=E)


def test_auto_takes_the_warp_specialised_kernel_for_one_row_or_a_few_long_ones():
    assert geometry.ws_preferred(1, 64, 128)
    assert geometry.ws_preferred(1, 64, 128, max_len=1 << 20)  # one row, however long
    assert geometry.ws_preferred(1, 64, 128, max_len=64)
    assert not geometry.ws_preferred(2, 64, 128)  # no length given: more rows take the wgmma kernel
    assert not geometry.ws_preferred(1, 64, 64)  # D = 128 only
    ampere = geometry.Device(sm_count=108, max_smem_per_block=166912, compute_capability=80)
    assert not geometry.ws_preferred(4, 64, 128, ampere, max_len=32768)  # Hopper only
    # a few long rows, up to WS_MAX_WORK (row, entry) pairs
    assert geometry.ws_preferred(2, 64, 128, max_len=131072)
    assert geometry.ws_preferred(64, 64, 128, max_len=geometry.WS_MIN_ROW_ENTRIES)
    assert not geometry.ws_preferred(2, 64, 128, max_len=262144)
    assert not geometry.ws_preferred(65, 64, 128, max_len=geometry.WS_MIN_ROW_ENTRIES)
    # short rows take the wgmma kernel at any count
    assert not geometry.ws_preferred(2, 64, 128, max_len=geometry.WS_MIN_ROW_ENTRIES - 1)
    assert not geometry.ws_preferred(128, 64, 128, max_len=1024)


def test_row_select_kernel_takes_128_threads_for_short_rows_and_k_up_to_1024():
    # prefill's causal rows (<= 2,048 entries, k <= 1,024): the 128-thread form, 16 keys a
    # thread; longer rows or larger k: 256 threads with every top-k; past 4,096 entries the
    # rows are read by every pass (no registers)
    # (k <= 512: the instance with half the winners' slots)
    assert geometry.row_select_kernel(2048, 1024, 4096) == ("topk_row_kernel<128, 1024, 16>", 128)
    assert geometry.row_select_kernel(2048, 513, 4096) == ("topk_row_kernel<128, 1024, 16>", 128)
    assert geometry.row_select_kernel(2048, 512, 4096) == ("topk_row_kernel<128, 512, 16>", 128)
    assert geometry.row_select_kernel(128, 1, 4096) == ("topk_row_kernel<128, 512, 16>", 128)
    assert geometry.row_select_kernel(2176, 512, 4096) == ("topk_row_kernel<256, 4096, 16>", 256)
    assert geometry.row_select_kernel(2048, 1025, 4096) == ("topk_row_kernel<256, 4096, 16>", 256)
    assert geometry.row_select_kernel(4224, 64, 4096) == ("topk_row_kernel<256, 4096, 0>", 256)


@pytest.mark.parametrize("T,max_len,ok", [
    (4096, 263_168, True),     # prefill-chunk: one sequence's rows over a long context
    (16, 2048, True),          # the smallest call the rule takes
    (15, 263_168, False),      # too few rows to amortise a group's decode
    (64, 2047, False),         # too short a pool
    (2048, 4095, False),       # rows not half as many as entries: causal from the start
    (8192, 2048, False),       # prefill-8K: short causal rows stay with the pair kernel
])
def test_keys_stationary_is_taken_for_many_long_rows(T, max_len, ok):
    assert geometry.ks_preferred(T, 64, 128, max_len, H200, 64) is ok
    assert not geometry.ks_preferred(T, 64, 64, max_len, H200, 64)  # D = 128 only
    assert not geometry.ks_preferred(T, 64, 128, max_len, Device(132, 232448, 80), 64)  # Hopper only


@pytest.mark.parametrize("T,max_len", [(216, 263_168), (8192, 2048), (40, 20_032), (1, 800), (300, 3008)])
def test_keys_stationary_launch_is_one_cta_an_sm(T, max_len):
    # the kernel shares the (group, row) items out itself: the launch is one persistent CTA
    # an SM, its scores' row stride the tile-rounded length
    sl = geometry.score_ks_launch(T, 64, 128, max_len, H200, 64)
    assert sl.grid == (H200.sm_count, 1) and sl.balanced
    assert sl.smem == geometry.ks_smem_bytes(128) <= H200.max_smem_per_block
    assert sl.ld % geometry.TILE_ENTRIES == 0 and sl.ld >= max_len


@pytest.mark.parametrize("T,seqs,max_len,ok", [
    (4 * 512, 4, 9000, True),     # four chunks of 512 rows after 8K prefixes
    (128, 64, 65_538, False),     # mtp-2: two rows a sequence
    (575, 64, 263_168, False),    # a chunk beside 63 decode rows: 8 rows a sequence on average
    (257 * 32, 257, 65_536, False),  # more sequences than a launch takes
])
def test_keys_stationary_rule_counts_rows_a_sequence(T, seqs, max_len, ok):
    assert geometry.ks_preferred(T, 64, 128, max_len, H200, 64, seqs) is ok


@pytest.mark.parametrize("T,seqs,max_len,ok", [
    (8192, 1, 2048, True),       # prefill-8K: 8,192 causal rows over 2,048 entries
    (8192, 4, 4096, True),       # four sequences of 2,048 rows over 4,096
    (4096, 1, 1024, True),       # the least work measured faster than pairs
    (2048, 1, 4096, True),       # half as many rows as entries: faster than keys-stationary
    (2048, 1, 512, False),       # too little work: the pair kernel measured faster
    (512, 1, 2176, False),       # the keys-stationary kernel's shape
    (256, 1, 32_768, False),     # enough work, but few rows over many entries: keys-stationary
    (8192, 1, 263_168, False),   # a long pool: its fp16 image would not stay in L2
    (8192, 1024, 2048, False),   # eight rows a sequence (and more sequences than a launch takes)
    (130, 1, 1 << 17, False),    # enough work, but an image of 32 MB
])
def test_dense_kernel_is_taken_for_much_prefill_over_a_short_pool(T, seqs, max_len, ok):
    assert geometry.dense_preferred(T, 64, 128, max_len, H200, 64, seqs) is ok
    assert not geometry.dense_preferred(T, 64, 64, max_len, H200, 64, seqs)  # D = 128 only
    assert not geometry.dense_preferred(T, 65, 128, max_len, H200, 64, seqs)  # at most 64 heads
    assert not geometry.dense_preferred(T, 64, 128, max_len, H200, 48, seqs)  # a power-of-two E
    assert not geometry.dense_preferred(T, 64, 128, max_len, Device(132, 232448, 80), 64, seqs)  # Hopper only


def test_dense_launch_fits_one_cta_an_sm():
    # one persistent CTA an SM: its dynamic shared memory and the kernel's static 2.3 KB
    # under the opt-in limit; its schedule holds every item of a full run
    sl = geometry.score_dense_launch(8192, 64, 128, 2048, H200, 64)
    src = (Path(__file__).resolve().parent.parent / "kernels" / "score_dense.cu").read_text()
    mma_groups = int(re.search(r"constexpr int kMmaGroups = (\d+);", src).group(1))
    assert sl.grid == (H200.sm_count, 1) and sl.block == (128 * (1 + mma_groups),) and sl.balanced
    assert sl.smem == geometry.dense_smem_bytes(128) and sl.smem + 2304 <= H200.max_smem_per_block
    assert sl.ld % geometry.TILE_ENTRIES == 0 and sl.ld >= 2048
    assert -(-geometry.DENSE_MAX_ROWS // geometry._DENSE_QUERIES) + geometry.DENSE_MAX_SEQS <= geometry._DENSE_MAX_ITEMS
    assert geometry.dense_image_bytes(3, 130) == 3 * 3 * geometry.DENSE_UNIT_BYTES  # units rounded up
    with pytest.raises(ValueError, match="at most 8192 rows a run"):
        geometry.score_dense_launch(8193, 64, 128, 2048, H200, 64)
    with pytest.raises(ValueError, match="D = 128"):
        geometry.score_dense_launch(64, 64, 64, 2048, H200, 64)


def test_the_sampled_threshold_is_taken_where_its_candidates_fit_the_buffer():
    # ~max(2 k, 32 ld / 8,192) expected candidates, at most half of the 8,192-slot buffer:
    # prefill-chunk's rows (263,168 entries, k = 1,024) take it; larger k or longer rows not
    assert geometry.sampled_threshold_fits(1024, 263_168)
    assert geometry.sampled_threshold_fits(geometry.SAMPLED_MAX_K, geometry.SAMPLED_MAX_LEN)
    assert not geometry.sampled_threshold_fits(geometry.SAMPLED_MAX_K + 1, 8192)
    assert not geometry.sampled_threshold_fits(16, geometry.SAMPLED_MAX_LEN + 128)
    expected = max(2 * geometry.SAMPLED_MAX_K, 32 * geometry.SAMPLED_MAX_LEN // 8192)
    assert expected <= geometry.CANDIDATE_CAP // 2


# ------------------------------------------------------------- boundaries (found by mutation testing)


def test_a_run_budgets_every_histogram_counter_of_a_row():
    """A row's scratch: its scores, its histogram's bins and the spare bin, its candidates."""
    assert geometry.workspace_row_bytes(128) == 4 * 128 + 4 * (geometry.HIST_BINS + 1) + 8 * geometry.CANDIDATE_CAP


def test_exactly_one_wave_of_rows_is_one_run_a_row():
    assert geometry.score_mma_launch(3 * 132, 64, 128, 8192).grid == (396, 1)


def test_the_dense_kernel_is_taken_at_exactly_a_quarter_as_many_rows_as_entries():
    assert geometry.dense_preferred(2048, 64, 128, 8192)


def test_two_filter_ctas_an_sm_keep_sixteen_entries_a_thread():
    assert geometry.select_fast_per_thread(264, 4096) == 16


@pytest.mark.parametrize("T,n_seq,split", [
    (128, 64, False),   # mtp-2: every pair shares
    (256, 64, False),   # mtp-4
    (192, 64, True),    # mtp-3: a lone row a request
    (64, 64, True),     # one row a request: every row alone
    (8191, 1, False),   # one sequence: at most one lone row
    (8192, 1, False),
    (10, 3, True),      # rows that do not divide into the sequences: lone rows likely
    (0, 0, False),
    (5 * 64, 64, True),  # five rows a request
    (8 * 3 + 1, 3, False),  # past 8 rows a sequence on average: few lone rows among many
    (3001, 7, False),    # a ragged prefill
])
def test_pair_calls_split_off_their_lone_rows_where_many_are_expected(T, n_seq, split):
    assert geometry.pairs_split(T, n_seq) is split


@pytest.mark.parametrize("T,n_seq,pairs", [(128, 64, True), (65, 64, True), (64, 64, False), (3, 5, False),
                                           (1, 1, False), (8192, 1, True)])
def test_grouped_calls_take_the_pair_kernel_where_rows_outnumber_sequences(T, n_seq, pairs):
    assert geometry.pairs_preferred(T, n_seq) is pairs


def test_rows_past_the_short_row_bound_take_one_cta_a_row_only_where_they_fill_the_sms():
    # rows of up to 2,048 entries are always selected a CTA a row; rows of up to 4,096 only
    # where there are more of them than half the SMs (fewer leave most SMs idle: v105)
    dev = geometry.H200
    half = int(geometry.ROW_SELECT_LONG_ROWS_PER_SM * dev.sm_count)
    for T in (1, 4, half, half + 1, 1000):
        assert geometry.row_select_preferred(T, 128, dev) and geometry.row_select_preferred(T, 2048, dev)
        assert geometry.row_select_preferred(T, 2176, dev) == (T > half)
        assert geometry.row_select_preferred(T, 4096, dev) == (T > half)
        assert not geometry.row_select_preferred(T, 4224, dev)  # past ROW_SELECT_MAX_LEN: the multi-CTA passes
    assert half == 66 and geometry.row_select_preferred(67, 4096, dev) and not geometry.row_select_preferred(66, 4096, dev)


def test_keys_stationary_runs_stream_their_select_only_over_short_enough_rows():
    dev = geometry.H200
    many = dev.sm_count  # an SM's worth of rows: row_stream_select streams them
    assert geometry.row_stream_select(many, 512, dev)
    assert geometry.sampled_streams(many, 512, geometry.SAMPLED_STREAM_MAX_LEN, dev)
    assert not geometry.sampled_streams(many, 512, geometry.SAMPLED_STREAM_MAX_LEN + 128, dev)  # long rows: sampled
    assert not geometry.sampled_streams(8, 512, 16384, dev)  # too few rows to stream (they rank)
    assert not geometry.sampled_streams(many, 2048, 16384, dev)  # k past what a streaming CTA holds


def test_grouped_calls_of_little_work_score_their_rows_alone():
    # few requests of a few rows each: the pair kernel's fixed costs outweigh the decodes it
    # shares below PAIRS_MIN_WORK (row, entry) pairs (v105)
    assert geometry.PAIRS_MIN_WORK == 1 << 20 and geometry.PAIRS_SPLIT_MIN_WORK == 1 << 22
    assert not geometry.pairs_pay(2, 262_144, 1) and not geometry.pairs_pay(4, 65_536, 2)  # mtp-2 at batch 1-2
    assert geometry.pairs_pay(4, 262_144, 2) and geometry.pairs_pay(128, 65_536, 64)  # mtp-2 at batch 2; the bench's
    assert geometry.pairs_pay(8192, 2048, 1)  # prefill-8K's rows (the dense kernel's, or pairs where it does not apply)
    # calls that split off their lone rows (three rows a request) pay a second launch
    assert geometry.pairs_split(24, 8) and not geometry.pairs_pay(24, 65_536, 8)  # 2^20.6 pairs
    assert geometry.pairs_split(96, 32) and geometry.pairs_pay(96, 65_536, 32)  # 2^22.6
    assert geometry.pairs_pay(192, 65_536, 64)  # the bench's mtp-3
