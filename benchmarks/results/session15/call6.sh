# Session 15, device call 6: torch.func on CUDA (launcher references under transforms), the
# launch-prep patch (descriptor keys in Python, CUtensorMap reuse, dense plan args: issue 20)
# in check mode and its host cost, the FP8 MoE layer at both shapes and cadences (issue 24).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 60 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/test_torch_nn_behaviour.py \
  > $OUT/tests_nn.log 2>&1
echo "nn tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_nn.log | cut -c1-220; tail -1 $OUT/tests_nn.log
timeout -s INT 230 env FUSEOPS_CHECK_LAUNCH=1 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu \
  tests/kernels/test_launch.py tests/kernels/test_launch_descriptors.py tests/kernels/gemm/test_dense.py > $OUT/tests_launch.log 2>&1
echo "launch tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_launch.log | cut -c1-220; tail -1 $OUT/tests_launch.log
timeout 40 python3 -m benchmarks.host_costs > $OUT/host_costs.log 2>&1; echo "host_costs rc=$?"
timeout 110 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1; echo "fp8_moe rc=$?"
timeout 80 python3 -m benchmarks.sizes --part dense --acts gelu --T 1024 4096 --H 1024 --reps 10 --out $OUT/sizes_dense_small > $OUT/sizes_dense_small.log 2>&1
echo "sizes rc=$?"
tail -9 $OUT/host_costs.log | cut -c1-140
grep -E "micro-batch|^[a-z].*\{" $OUT/fp8_moe.log | cut -c1-140
tail -3 $OUT/sizes_dense_small.log | cut -c1-150
