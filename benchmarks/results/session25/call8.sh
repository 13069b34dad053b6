# Session 25, device call 8: the GPU-bound rule at the two host-bound cells under 1.2x (bound_ab.py), and the
# fuseops kernels of gelu T=4096 H=1024 (cut from call 5's tail).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/session25/bound_ab.py 2>&1 | grep -v Warn
FUSEOPS_CUDA_GRAPHS=0 timeout 100 python3 benchmarks/results/session25/kernel_profile.py --top 12 --cells gelu:4096:1024 2>&1 | grep -v Warn | head -14
