# Session 25, device call 5: kernels of the dense cells under target in call 4 (gelu T=4096 H=1024 1.05x,
# gelu T=1024 H=2048 1.11x, gelu T=1024 H=4096 0.99x, gelu T=4096 H=4096 0.97x).
export PYTHONPATH=. PYTHONUNBUFFERED=1
FUSEOPS_CUDA_GRAPHS=0 timeout 300 python3 benchmarks/results/session25/kernel_profile.py --top 12 \
  --cells gelu:4096:1024 gelu:1024:2048 gelu:1024:4096 gelu:4096:4096 2>&1 | grep -v Warn
