# Session 33, call 1: session 32's prepared call 1, run as written (its run_gpu.sh fp8layer part, then fp8_moe at Qwen3).
bash benchmarks/results/session32/call1.sh
