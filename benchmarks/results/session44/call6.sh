# Session 44, call 6: the CUDA property suite's last six fusions (calls 4-5 ran the other eight).
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=540 bash benchmarks/run_gpu.sh props "ForwardQuantizeLinear or ForwardNormQuantizeLinear or ForwardActivationQuantizeLinear or BackwardQuantizedGatedMLP or BackwardGatedAmaxLinear or BackwardExtraOutputLinear" 2>&1 | tail -3
grep -E "PASSED|FAILED|ERROR" $OUT/props.log | sed 's/.*cuda\[//; s/\] / /' | cut -c1-120
