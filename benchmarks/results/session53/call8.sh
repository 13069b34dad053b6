# Session 53, device call 8: the trims' host time, paired step by step with the GPU kept busy (run 7's A/B of step
# times was noisier than the effect).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 python3 benchmarks/results/session53/host_ab.py --compiled 2>&1 | grep -v Warn | tee $OUT/host_ab.log
