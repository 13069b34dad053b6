# Session 48 run 4 (branch dead-results with the cover's pieces and the release after a collection): the graphs
# part, the release probe, the compile GPU tests, float32 weights under autocast (owed since session 47's hot-path
# change), the host-bound cells' memory at the default rule (session 46 call 12 without reuse: 394 / 1094 / 1874 / 3366 MB).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
LIMIT=200 bash benchmarks/run_gpu.sh graphs > $OUT/graphs.log 2>&1; tail -2 $OUT/graphs.log | cut -c1-300
timeout 60 python3 benchmarks/results/session48/dead_results_probe.py release > $OUT/release.log 2>&1; echo "release rc=$?"; tail -4 $OUT/release.log | cut -c1-200
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_compile.py tests/test_compiled_sequential.py > $OUT/compile.log 2>&1; tail -2 $OUT/compile.log | cut -c1-300
timeout 150 python3 -m benchmarks.autocast --T 1024 > $OUT/autocast.log 2>&1; echo "autocast rc=$?"; tail -5 $OUT/autocast.log | cut -c1-200
timeout $((560 - SECONDS)) python3 benchmarks/results/session46/shared_pool.py --cells gelu:1024:1024 swiglu:1024:2048 moe:olmoe:1024 moe:qwen3:1024 --variants torch today > $OUT/shared_pool.log 2>&1; echo "shared_pool rc=$?"
cut -c1-170 $OUT/shared_pool.log
