# Session 53, device call 2: the trims A/B in one process; the MoE layer's host path (Qwen3 T=1024 uniform).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 python3 benchmarks/results/session53/ab_trims.py 2>&1 | grep -v Warn | tee $OUT/ab_trims.log
timeout 150 python3 benchmarks/results/session53/moe_host.py --top 35 > $OUT/moe_host.log 2>&1; echo "moe_host rc=$?"
head -3 $OUT/moe_host.log
