# Session 28, device call 10: more quantized CUDA edge cases (the dense quantized fusions' zero rows and
# non-finite inputs; not run since session 23).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
LIMIT=420 bash benchmarks/run_gpu.sh edge "(ForwardQuantizeLinear or ForwardNormQuantizeLinear or ForwardActivationQuantizeLinear) and (zero_rows or non_finite)"; cp /tmp/fuseops-gpu/edge.log $OUT/ 2>/dev/null
echo "edge ($((SECONDS - S)) s)"; grep -E "PASSED|FAILED|ERROR" $OUT/edge.log | sed 's/.*test_edge_case_on_cuda//' | cut -c1-120
