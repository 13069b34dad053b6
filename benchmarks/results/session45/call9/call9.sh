# Session 45 call 9 (warm machine, the budget's end): the quantops part as far as 200 s go.
LIMIT=200 bash benchmarks/run_gpu.sh quantops 2>&1 | tail -4
