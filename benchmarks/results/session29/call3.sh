# Session 29, device call 3: why the two operators did not apply on torch 2.11 (call 2).
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 benchmarks/results/session29/applies_probe.py 2>&1 | tail -5
