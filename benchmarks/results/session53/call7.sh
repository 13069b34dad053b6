# Session 53, device call 7: the trims A/B in one process, eager and compiled, at H=2048 T=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 230 python3 benchmarks/results/session53/ab_trims.py --cells gelu:1024:2048 swiglu:1024:2048 --rounds 4 \
  --compiled 2>&1 | grep -v Warn | tee $OUT/ab_trims_compiled.log
