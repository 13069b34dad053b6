# Session 48 run 3 (branch dead-results, the cover taking small-pool blocks in pieces): the graphs part, the routing and
# release probes, peak memory with every program graphed against the default rule and torch eager.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
LIMIT=230 bash benchmarks/run_gpu.sh graphs > $OUT/graphs.log 2>&1; tail -3 $OUT/graphs.log | cut -c1-300
timeout 60 python3 benchmarks/results/session48/dead_results_probe.py routing > $OUT/routing.log 2>&1; echo "routing rc=$?"; tail -2 $OUT/routing.log | cut -c1-300
timeout 90 python3 benchmarks/results/session48/dead_results_probe.py release > $OUT/release.log 2>&1; echo "release rc=$?"; tail -5 $OUT/release.log | cut -c1-300
timeout 250 python3 benchmarks/results/session46/shared_pool.py --cells gelu:4096:4096 swiglu:4096:4096 moe:qwen3:4096 moe:olmoe:16384 gelu:16384:4096 --variants torch today all_shared > $OUT/shared_pool.log 2>&1; echo "shared_pool rc=$?"
cut -c1-170 $OUT/shared_pool.log
