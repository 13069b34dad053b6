# Session 45 call 7 (warm machine of call 6): the models part.
LIMIT=480 bash benchmarks/run_gpu.sh models 2>&1 | tail -4
