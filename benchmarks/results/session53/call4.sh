# Session 53, device call 4: tests/ops/executor on the device's torch 2.11 (CPU and GPU tests); the MoE layer's host
# against torch's one graph each way; issue 20's host-bound dense cells with the trims.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider -x tests/ops/executor > $OUT/executor.log 2>&1
echo "executor rc=$?"; tail -1 $OUT/executor.log
timeout 120 python3 benchmarks/results/session53/moe_floor.py 2>&1 | grep -v Warn | tee $OUT/moe_floor.log | cut -c1-250
timeout 200 python3 -m benchmarks.sizes --part dense --H 1024 2048 --T 1024 --rounds 3 --out $OUT/dense_t1024 \
  > $OUT/dense_t1024.log 2>&1; echo "sizes rc=$?"
tail -8 $OUT/dense_t1024.log | cut -c1-250
