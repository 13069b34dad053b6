# Session 31, device call 2: the GPU tests call 1's time limit cut off (from the expert_layer autocast
# test on: permute, test_compile.py); expert_layer's host split (cProfile, then timed functions);
# the GPU's work in one step of the eager and compiled compositions, torch.compile and the layer
# (torch.profiler); the routing's CPU tests on torch 2.11 that call 1 did not reach.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 220 python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu \
  "tests/moe/test_routing_graphs.py::test_gpu_float32_parameters_under_autocast_with_graphs" \
  tests/kernels/moe/test_permute.py tests/test_compile.py -v > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/gpu_tests.log | cut -c1-250 | head -12; tail -1 $OUT/gpu_tests.log; S=$SECONDS
timeout 90 python3 benchmarks/results/session31/layer_host_split.py qwen3 1024 > $OUT/layer_host_split.log 2>&1
echo "layer host split rc=$? ($((SECONDS - S)) s)"; grep -E "^== |^with" $OUT/layer_host_split.log | cut -c1-300; sed -n '/function (inclusive)/,/^with/p' $OUT/layer_host_split.log | head -30; S=$SECONDS
timeout 150 python3 benchmarks/results/session31/gpu_split.py qwen3 1024 > $OUT/gpu_split.log 2>&1
echo "gpu split rc=$? ($((SECONDS - S)) s)"; grep -E "^== " $OUT/gpu_split.log | cut -c1-330; S=$SECONDS
timeout -s INT -k 10 100 python3 -m pytest -q -p no:cacheprovider --tb=short tests/moe/test_routing_graphs.py \
  tests/kernels/moe/test_traceable.py -m "not gpu" > $OUT/cpu_tests.log 2>&1
echo "cpu tests (torch 2.11) rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/cpu_tests.log | cut -c1-250 | head -12; tail -1 $OUT/cpu_tests.log
