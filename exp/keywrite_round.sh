#!/usr/bin/env bash
# The GPU key writer's device round (kernels/key_write.cu): its tests and the pool's, memcheck
# over the device pool's tests, then its timing. Each step logs to $OUT as it goes.
#   bash exp/keywrite_round.sh
set -uo pipefail
export PYTHONPATH=.
out=${OUT:-/tmp}
opts=(-o addopts="" -p no:cacheprovider -q)
timeout 150 python -m pytest "${opts[@]}" -n 8 tests/test_cuda_pool.py tests/test_pool.py tests/test_key_write_rounding.py \
    tests/test_cuda_torch_ops.py > "$out/touched.log" 2>&1
tail -15 "$out/touched.log"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 python -m pytest "${opts[@]}" -x tests/test_cuda_pool.py \
    -k "append_many or equals_host or stream or unvalidated" > "$out/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -6 "$out/memcheck.log"
timeout 120 python exp/key_write_time.py > "$out/time.log" 2>&1
cat "$out/time.log"
timeout 60 python exp/append_profile.py > "$out/profile.log" 2>&1
head -8 "$out/profile.log"
