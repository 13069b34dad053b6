# Session 26, device call 10: tests/moe and tests/ops whole on the GPU (every change of the session:
# graphs' results handed out at capture, written inputs restored, routing graphs, copy/save).
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=$OUT LIMIT=560 bash benchmarks/run_gpu.sh ops
