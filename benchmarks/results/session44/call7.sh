# Session 44, call 7: the CUDA property suite's last two fusions (calls 4-6 ran the other twelve).
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=420 bash benchmarks/run_gpu.sh props "BackwardGatedAmaxLinear or BackwardExtraOutputLinear" 2>&1 | tail -3
grep -E "PASSED|FAILED|ERROR" $OUT/props.log | sed 's/.*cuda\[//; s/\] / /' | cut -c1-120
