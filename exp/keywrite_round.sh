#!/usr/bin/env bash
# The GPU key writers' device round (kernels/key_write.cu: KeyPool's writes, indexer.write_keys):
# their tests and the pool's, memcheck over them, the timing, then main's whole suite. Each
# step logs to $OUT as it goes (give the call the whole 600 s; the suite comes last, ~300 s on an H100).
#   bash exp/keywrite_round.sh
set -uo pipefail
export PYTHONPATH=.
out=${OUT:-/tmp}
opts=(-o addopts="" -p no:cacheprovider -q)
timeout 150 python -m pytest "${opts[@]}" -n 8 tests/test_cuda_pool.py tests/test_pool.py tests/test_key_write_rounding.py \
    tests/test_cuda_write_keys.py tests/test_write_keys.py tests/test_cuda_torch_ops.py > "$out/touched.log" 2>&1
tail -15 "$out/touched.log"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python -m pytest "${opts[@]}" -x \
    tests/test_cuda_write_keys.py tests/test_cuda_pool.py -k "not 2048 and not float16" > "$out/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -6 "$out/memcheck.log"
timeout 90 python exp/key_write_time.py > "$out/time.log" 2>&1
cat "$out/time.log"
timeout 330 python -m pytest -n 8 -m "not exclusive" "${opts[@]}" tests > "$out/suite_xdist.log" 2>&1
tail -4 "$out/suite_xdist.log"
