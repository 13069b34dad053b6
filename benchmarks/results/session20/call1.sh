# Session 20, device call 1: GPU verification not run in sessions 18-19: the layers part
# (ops, quant, top-level tests) of run_gpu.sh, gpu-marked and not.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=560 bash benchmarks/run_gpu.sh layers
