# Session 16, device call 7: the rest of call 6's GPU tests (the one-slab bias reductions, the
# grouped MLP fusions, dispatch; then the edge-case suite as far as its limit), and the dense
# sizes at the host-bound cells (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT 150 $q tests/kernels/elementwise/test_activation.py tests/kernels/elementwise/test_bias_grad.py \
  tests/kernels/test_dispatch.py tests/fusions/test_grouped_mlp.py tests/fusions/test_forward_quantized_grouped_mlp.py \
  > $OUT/tests_rest.log 2>&1
echo "rest tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_rest.log | cut -c1-220; tail -1 $OUT/tests_rest.log
timeout 85 python3 -m benchmarks.sizes --part dense --acts gelu swiglu --T 1024 4096 --H 1024 --reps 10 --out $OUT/sizes_dense_small > $OUT/sizes_dense_small.log 2>&1
echo "sizes rc=$?"
timeout -s INT 240 $q -v tests/fusions/test_edge_cases.py > $OUT/tests_edge.log 2>&1
echo "edge tests rc=$?"; grep -cE " PASSED" $OUT/tests_edge.log; grep -E " (FAILED|ERROR)" $OUT/tests_edge.log | cut -c1-200 | head
tail -6 $OUT/sizes_dense_small.log | cut -c1-150
