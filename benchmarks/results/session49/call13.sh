# Session 49 run 13: under FUSEOPS_CUDA_GRAPHS=all the call after the timed runs waits for them (a step's programs capture
# in one step): memory with every program graphed, each cell first in a fresh process; then the graphs part.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for c in gelu:4096:4096 swiglu:4096:4096 gelu:16384:4096 moe:qwen3:4096; do
  timeout 110 python3 benchmarks/results/session46/shared_pool.py --cells $c --variants all_shared today torch > $OUT/fresh_${c//:/_}.log 2>&1
  echo "$c rc=$?"; tail -3 $OUT/fresh_${c//:/_}.log | cut -c1-200
done
LIMIT=200 bash benchmarks/run_gpu.sh graphs
