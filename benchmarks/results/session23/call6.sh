# Session 23, device call 6: where the GPU time of the GPU-bound dense cells below 1.0x goes (calls 3, 5:
# GELU T=16384 H=4096 0.96x, SwiGLU 0.97x, GELU T=4096 H=4096 0.98x the faster torch): kernels per step of
# fuseops eager against torch.compile, from torch.profiler; then the kernels part of the GPU suite in
# what time is left.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 300 python3 benchmarks/results/session23/kernel_profile.py > $OUT/kernel_profile.log 2>&1
echo "profile rc=$? ($((SECONDS - S)) s)"; grep -v Warning $OUT/kernel_profile.log | grep -E "^(==|  )" | cut -c1-150
LIMIT=$((585 - (SECONDS - S))) bash benchmarks/run_gpu.sh kernels
echo "total $((SECONDS - S)) s"
