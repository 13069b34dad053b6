# Session 19, device call 2: does the dense eager step sync the host (step = enqueue + GPU time)?
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/results/session19/sync_gap.py 4096,1024 1024,2048 1024,1024 2>&1 | grep -v Warning
