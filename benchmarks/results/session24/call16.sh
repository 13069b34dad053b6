# Session 24, device call 16: steady.py again with GPU_BOUND 2.0 (call 15: host-bound programs spanned 1.1-1.3x their enqueue time), counts during the timed rounds.
export PYTHONPATH=. ; timeout 200 python3 benchmarks/results/session24/steady.py 2>&1 | grep -v Warn | tail -6
