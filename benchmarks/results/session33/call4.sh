# Session 33, call 4: session 32's prepared call 3, run as written (sizes --part moe at T=1024 and 4096, benchmarks.autocast, run_gpu.sh top -m gpu).
bash benchmarks/results/session32/call3.sh
