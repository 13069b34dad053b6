# Session 62: torch.nn's compiled models with batched cotangents on CUDA (nn_batched_inductor.py).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 120 python3 benchmarks/results/session62/nn_batched_inductor.py 2>&1 | tee "$OUT_PART/log" | grep -v Warning
