# Session 15, device call 2: the tests call 1 failed or did not reach (compile after the enum
# hash fix, the row-amax dprobs, the offload tests), issue 22's Qwen3 autocast row at T=16384,
# the dense sizes table with GELU and SwiGLU (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 190 env FUSEOPS_CHECK_LAUNCH=1 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/test_compile.py \
  tests/fusions/test_backward_gated_amax_linear.py tests/kernels/elementwise/test_gated_activation.py tests/offload \
  > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | cut -c1-220; tail -1 $OUT/tests.log
timeout 60 python3 -m benchmarks.autocast --models qwen3 --T 16384 --rounds 2 --out $OUT/autocast_qwen3_T16384.json \
  > $OUT/autocast.log 2>&1; echo "autocast rc=$?"
timeout 300 python3 -m benchmarks.sizes --part dense --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes rc=$?"
tail -2 $OUT/autocast.log | cut -c1-140
tail -20 $OUT/sizes_dense.log | cut -c1-150
