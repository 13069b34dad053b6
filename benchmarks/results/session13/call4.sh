# Session 13, device call 4: the offload planner's fixes (issue 23: its GPU tests and the
# curve), expert_layer's GPU tests (issue 25), the host costs after the launcher trims (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/offload \
  > $OUT/offload_tests.log 2>&1
echo "offload tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/offload_tests.log | cut -c1-200; tail -1 $OUT/offload_tests.log
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu \
  tests/moe/test_expert_layer.py tests/kernels/gemm/test_grouped_wgrad.py tests/moe/test_moe_layer.py tests/kernels/test_library.py \
  > $OUT/moe_tests.log 2>&1
echo "moe tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/moe_tests.log | cut -c1-200; tail -1 $OUT/moe_tests.log
timeout 40 python3 -m benchmarks.host_costs > $OUT/host_costs.log 2>&1; echo "host_costs rc=$?"
timeout 190 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
grep -A12 "^mlp\|^attn\|^moe" $OUT/offload.log | head -40; tail -8 $OUT/host_costs.log
