# Session 24, device call 14: the host-bound dense cells in steady state (steady.py), graphs on / off / torch eager interleaved.
export PYTHONPATH=. ; timeout 200 python3 benchmarks/results/session24/steady.py 2>&1 | grep -v Warn | tail -6
