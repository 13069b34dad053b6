# Session 25, device call 11: CUDA edge cases of the quantized forward fusions (not run since session 19).
LIMIT=500 bash benchmarks/run_gpu.sh edge "ForwardQuantizeLinear or ForwardNormQuantizeLinear or ForwardActivationQuantizeLinear"
grep -cE " PASSED" $OUT/edge.log; grep -E " PASSED| FAILED" $OUT/edge.log | tail -2 | cut -c1-160
