# Session 45 call 4 (the warm machine of call 3): the top-level tests.
LIMIT=320 bash benchmarks/run_gpu.sh top 2>&1 | tail -4
