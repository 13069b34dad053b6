# Session 13, device call 3: the float32 weight-gradient path (issue 22): its GPU tests and the
# autocast benchmark; the host costs after the executor's first trims (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 60 python3 -m benchmarks.host_costs > $OUT/host_costs.log 2>&1; echo "host_costs rc=$?"
timeout -s INT 300 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu \
  tests/kernels/hopper/test_wgrad.py tests/kernels/gemm/test_grouped_wgrad.py tests/ops/executor/test_autocast_weight_grads.py \
  tests/ops/executor/test_autocast.py tests/fusions/test_grouped_mlp.py tests/kernels/test_library.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | cut -c1-220; tail -1 $OUT/tests.log
timeout 200 python3 -m benchmarks.autocast > $OUT/autocast.log 2>&1; echo "autocast rc=$?"
cp benchmarks/results/autocast.json $OUT/ 2>/dev/null
tail -12 $OUT/autocast.log; cat $OUT/host_costs.log
