# Session 31, device call 6: this session's host cuts A/B in ONE process (inprocess_ab.py: the modules
# before them loaded beside the installed ones, variants interleaved; calls 3-4's per-process A/B was
# within the host's run-to-run spread); the compiled MoE layer's op-programs GPU test (call 5's failure:
# its expectation predated the routing's graph states under compile); two CUDA edge cases of
# ForwardQuantizedGroupedMLP not yet run on a GPU.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 benchmarks/results/session31/inprocess_ab.py 1024 7 qwen3 olmoe > $OUT/inprocess_ab.log 2>&1
echo "in-process A/B rc=$? ($((SECONDS - S)) s)"; grep -E "T=|states|Error" $OUT/inprocess_ab.log | cut -c1-400; S=$SECONDS
timeout -s INT -k 10 100 python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu \
  "tests/ops/executor/test_op_programs.py::test_gpu_compiled_moe_layer_equals_the_implementations" > $OUT/gpu_tests.log 2>&1
echo "op programs gpu test rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/gpu_tests.log | cut -c1-250 | head -8; tail -1 $OUT/gpu_tests.log; S=$SECONDS
LIMIT=190 bash benchmarks/run_gpu.sh edge "ForwardQuantizedGroupedMLP and (zero_rows or non_finite)"
echo "edge ($((SECONDS - S)) s)"
