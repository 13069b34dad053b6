# Session 44, call 5: the CUDA property suite's next fusions (call 4 ran GroupedMLP, ForwardQuantizedGroupedMLP,
# ForwardLinearBiasActivation before its limit).
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=560 bash benchmarks/run_gpu.sh props "ForwardLinearSeparateBiasActivation or ForwardLinearAddExtraInput or BackwardLinearBiasActivation or BackwardBiasActivation or BackwardActivationLinear" 2>&1 | tail -3
grep -E "PASSED|FAILED|ERROR" $OUT/props.log | sed 's/.*\[//; s/\] / /' | cut -c1-120
