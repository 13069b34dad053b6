# Session 44, call 4: GPU suite parts not run lately: `quantize`, then the CUDA property suite (`props`) as far as
# the time goes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
LIMIT=200 bash benchmarks/run_gpu.sh quantize 2>&1 | tail -4
echo "quantize ($((SECONDS - S)) s)"
LIMIT=$((565 - SECONDS)) bash benchmarks/run_gpu.sh props 2>&1 | tail -4
grep -E "PASSED|FAILED|ERROR" $OUT/props.log | sed 's/ PASSED.*//; s/ FAILED.*/ FAILED/' | tail -40 | cut -c1-150
