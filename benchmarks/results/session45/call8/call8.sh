# Session 45 call 8 (warm machine): the models2 part.
LIMIT=270 bash benchmarks/run_gpu.sh models2 2>&1 | tail -4
