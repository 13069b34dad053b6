# Session 49 run 8: peak memory and host time with every program graphed (all_shared) against the default rule and
# torch eager, after the keep rule's span cap (session 48 run 3's cells; then the dense ones again, a second process).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 290 python3 benchmarks/results/session46/shared_pool.py --cells gelu:4096:4096 swiglu:4096:4096 moe:qwen3:4096 moe:olmoe:16384 gelu:16384:4096 --variants torch today all_shared > $OUT/shared_pool_1.log 2>&1; echo "round 1 rc=$?"
timeout 240 python3 benchmarks/results/session46/shared_pool.py --cells gelu:4096:4096 swiglu:4096:4096 gelu:16384:4096 --variants all_shared today torch > $OUT/shared_pool_2.log 2>&1; echo "round 2 rc=$?"
cut -c1-200 $OUT/shared_pool_1.log; cut -c1-200 $OUT/shared_pool_2.log
