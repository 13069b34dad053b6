# Session 25, device call 7: the GPU suite's ops part (tests/moe, tests/ops), not run since session 21.
LIMIT=540 bash benchmarks/run_gpu.sh ops
