# Session 29, device call 11: quantized CUDA edge cases not run since session 23 (call 1 ran 8).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
OUT=$OUT LIMIT=330 bash benchmarks/run_gpu.sh edge "(ForwardNormQuantizeLinear and non_contiguous) or (ForwardActivationQuantizeLinear and (one_row or dtype_max or non_contiguous))"
echo "edge ($((SECONDS - S)) s)"; grep -E "PASSED|FAILED|ERROR" $OUT/edge.log | sed 's/.*test_edge_case_on_cuda//' | cut -c1-120
