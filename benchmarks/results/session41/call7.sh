# Session 41, call 7: the suite part `top` (tests/test_*.py, CPU and gpu-marked, torch 2.11; last run in session 33),
# on the final code (FUSEOPS_CUDA_GRAPHS parsed into GPU_BOUND; the default unchanged). ~9 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=540 bash benchmarks/run_gpu.sh top 2>&1 | tail -6
