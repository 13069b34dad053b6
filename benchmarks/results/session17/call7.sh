# Session 17, device call 7: GPU tests of the compile changes (routing and dense GEMM custom
# ops, lean op registration) and of the grouped launchers' unchecked descriptors (check mode);
# the MoE sizes table after them (issue 20); where the FP8 blockwise Mixtral layer's time goes (issue 24).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT 130 $q tests/test_compile.py tests/kernels/gemm/test_traced.py > $OUT/tests_compile.log 2>&1
echo "compile tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_compile.log | cut -c1-220; tail -1 $OUT/tests_compile.log
timeout -s INT 150 env FUSEOPS_CHECK_LAUNCH=1 $q tests/kernels/gemm/test_grouped.py tests/kernels/gemm/test_grouped_gated.py \
  tests/kernels/gemm/test_grouped_wgrad.py tests/kernels/gemm/test_tma_checks.py tests/kernels/test_launch_capture.py > $OUT/tests_grouped.log 2>&1
echo "grouped tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_grouped.log | cut -c1-220; tail -1 $OUT/tests_grouped.log
timeout 160 python3 -m benchmarks.sizes --part moe --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1; echo "sizes rc=$?"
timeout 120 python3 -m benchmarks.moe_profile --shape mixtral-8x7b --impls "fuseops fp8 blk" "fuseops fp8" fuseops --steps 5 --warmup-s 4 > $OUT/moe_profile.log 2>&1; echo "moe_profile rc=$?"
tail -20 $OUT/sizes_moe.log | cut -c1-200
cat $OUT/moe_profile.log | cut -c1-160 | tail -60
