# Session 31, device call 1: session 30's changes on the GPU for the first time. The GPU tests of
# tests/moe, tests/kernels/moe and test_compile.py; the compiled composition's routing A/B (graph
# states against the kernels' own ops, against torch.compile, one process); the expert_layer host split
# (torch.profiler CPU table); the routing's CPU tests on torch 2.11.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 200 python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/moe tests/kernels/moe \
  tests/test_compile.py > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/gpu_tests.log | cut -c1-250 | head -12; tail -1 $OUT/gpu_tests.log; S=$SECONDS
timeout 200 python3 benchmarks/results/session30/compiled_routing_ab.py 1024 qwen3 olmoe > $OUT/routing_ab.log 2>&1
echo "routing A/B rc=$? ($((SECONDS - S)) s)"; grep -E "T=|graph counts|Error" $OUT/routing_ab.log | cut -c1-400; S=$SECONDS
timeout 75 python3 benchmarks/results/session30/host_breakdown.py qwen3 1024 layer torch > $OUT/host_breakdown.log 2>&1
echo "host breakdown rc=$? ($((SECONDS - S)) s)"; grep -E "^== " $OUT/host_breakdown.log | cut -c1-400; S=$SECONDS
timeout -s INT -k 10 80 python3 -m pytest -q -p no:cacheprovider --tb=short tests/moe/test_routing_ops.py tests/moe/test_routing_graphs.py \
  tests/kernels/moe/test_traceable.py -m "not gpu" > $OUT/cpu_tests.log 2>&1
echo "cpu tests (torch 2.11) rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/cpu_tests.log | cut -c1-250 | head -12; tail -1 $OUT/cpu_tests.log
