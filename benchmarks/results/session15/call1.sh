# Session 15, device call 1: GPU tests of what was merged after session 14's last call (call
# cache, compile, traced products, norm launcher, dispatch, FP8 amax fusion, offload), the host
# costs, issue 22's autocast figures, the offload's host time by scheduler function.
export PYTHONPATH=. PYTHONUNBUFFERED=1 FUSEOPS_CHECK_LAUNCH=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -s INT 200 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/test_compile.py \
  tests/test_call_cache.py tests/ops/executor tests/kernels/gemm/test_traced.py tests/kernels/elementwise/test_norm.py \
  tests/kernels/test_dispatch.py tests/fusions/test_backward_gated_amax_linear.py tests/quant/test_emit.py \
  tests/kernels/elementwise/test_gated_activation.py tests/offload > $OUT/tests_a.log 2>&1
echo "tests a rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_a.log | cut -c1-220; tail -1 $OUT/tests_a.log
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/moe tests/fusions/test_grouped_mlp.py \
  tests/kernels/gemm/test_grouped.py tests/kernels/gemm/test_grouped_wgrad.py tests/kernels/gemm/test_grouped_gated.py \
  > $OUT/tests_b.log 2>&1
echo "tests b rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_b.log | cut -c1-220; tail -1 $OUT/tests_b.log
unset FUSEOPS_CHECK_LAUNCH
timeout 40 python3 -m benchmarks.host_costs > $OUT/host_costs.log 2>&1; echo "host_costs rc=$?"
timeout 110 python3 -m benchmarks.autocast --out $OUT/autocast.json > $OUT/autocast.log 2>&1; echo "autocast rc=$?"
timeout 60 python3 -m benchmarks.offload_host --cuda --breakdown --steps 10 > $OUT/offload_host.log 2>&1; echo "offload_host rc=$?"
tail -14 $OUT/host_costs.log | cut -c1-140
tail -4 $OUT/autocast.log | cut -c1-140
tail -30 $OUT/offload_host.log | cut -c1-140
