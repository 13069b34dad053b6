# Session 16, device call 1: verify what session 15 merged after its last GPU call: the grouped
# launchers' prep cut (check mode, issue 20), the offload planner's frozen re-plan (issue 23), the
# TENSOR+column-wise quantize tile 128x64 (issue 24); host costs and the MoE host profile.
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT 210 env FUSEOPS_CHECK_LAUNCH=1 $q tests/kernels/gemm/test_grouped.py tests/kernels/gemm/test_grouped_gated.py \
  tests/kernels/hopper/test_wgrad.py tests/kernels/hopper/test_shared_layout.py tests/kernels/moe tests/moe \
  tests/kernels/test_dispatch.py tests/kernels/test_dense_dispatch.py tests/kernels/quantization/test_formats.py \
  tests/kernels/test_launch_capture.py > $OUT/tests_grouped.log 2>&1
echo "grouped tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_grouped.log | cut -c1-220; tail -1 $OUT/tests_grouped.log
timeout -s INT 130 $q tests/offload > $OUT/tests_offload.log 2>&1
echo "offload tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_offload.log | cut -c1-220; tail -1 $OUT/tests_offload.log
timeout 110 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1; echo "fp8_moe rc=$?"
timeout 45 python3 -m benchmarks.host_costs > $OUT/host_costs.log 2>&1; echo "host_costs rc=$?"
timeout 50 python3 -m benchmarks.host_profile --parts moe --top 50 > $OUT/host_profile_moe.log 2>&1; echo "host_profile rc=$?"
grep -E "micro-batch|^[a-z].*\{" $OUT/fp8_moe.log | cut -c1-140
tail -16 $OUT/host_costs.log | cut -c1-140
grep "====" $OUT/host_profile_moe.log | cut -c1-200
