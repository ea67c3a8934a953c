#!/usr/bin/env bash
# The routing audit of docs/performance.md v105 in one `run` call (~2-3 min on an H100):
# each rule of indexer.geometry that picks a kernel or a select, at its boundary, against
# its variants, by scripts/ab_flags.py (graph replays of whole calls, one process, rounds
# alternated, answers compared bit for bit). Rerun it after a kernel changes: a rule is
# only as true as the kernels it was measured on. Each part's output goes to
# $OUT/<part>.log as it comes; the medians are printed.
#   bash exp/routing_audit.sh
set -uo pipefail
export PYTHONPATH=.
out=${OUT:-/tmp}
ab() { local part=$1; shift; python scripts/ab_flags.py --rounds 3 "$@" > "$out/$part.log" 2>&1;
       echo "== $part"; grep -E "whole call|median|Error" "$out/$part.log"; }
# one CTA a row for rows of 2,049-4,096 entries only past half the SMs (row_select_preferred)
ab row_select --cases decode-4x4096-k512,decode-16x4096-k1024,decode-64x4096-k512,decode-96x4096-k1024,decode-256x4096-k512,decode-16x2048-k512 --variant geometry.ROW_SELECT_LONG_ROWS_PER_SM=0 --variant geometry.ROW_SELECT_MAX_LEN=0
# all-pairs rank for up to 8 rows at rows x k <= 2,048 (rank_all_pairs)
ab all_pairs --cases decode-4x262144,decode-8x65536-k128,decode-8x262144-k256,decode-16x262144-k64 --variant geometry.RANK_ALL_PAIRS_ROWS=4 --variant geometry.RANK_ALL_PAIRS_ROWS=16,geometry.RANK_ALL_PAIRS_WORK=4096
# the warp-specialised kernel for a few long rows (ws_preferred)
ab ws --cases decode-2x32768,decode-16x8192,decode-64x4096,decode-64x8192,decode-1x2048-k512 --variant geometry.WS_MAX_WORK=0 --variant geometry.WS_MAX_WORK=1048576 --variant "call._fast_kernel='wgmma'"
# grouped calls: pairs only past their work bounds (pairs_pay), split calls (pairs_split)
ab pairs --cases mtp2-1x262144,mtp2-2x65536,mtp2-8x65536,mtp2-16x65536,mtp3-2x65536,mtp3-20x65536,mtp3-64x65536,mtp8-8x2048 --variant geometry.PAIRS_MIN_WORK=0,geometry.PAIRS_SPLIT_MIN_WORK=0 --variant geometry.PAIRS_MIN_WORK=16777216,geometry.PAIRS_SPLIT_MIN_WORK=16777216 --variant geometry.SPLIT_MAX_ROWS_PER_SEQ=0
# keys-stationary kernel (ks_preferred) and its select (sampled_streams)
ab ks --cases mtp16-4x16384-k512,mtp16-64x16384-k512,mtp32-16x16384-k512,mtp8-32x16384,mtp16-16x131072 --variant geometry.SAMPLED_STREAM_MAX_LEN=0 --variant "call._fast_kernel='pairs'"
# the streamed select for an SM's worth of rows (row_stream_select)
ab stream --cases decode-128K,mtp-2,decode-100x32768-k512 --variant geometry.ROW_STREAM_SMEM=1000000000
# the exact path's select
ab exact --precision exact --cases decode-16x4096-k1024,decode-1x4096-k1024 --variant geometry.ROW_SELECT_LONG_ROWS_PER_SM=0
