# Session 49 run 12: graph memory counted per graph (a freed graph no longer takes a later one's results at its
# addresses out of it): the churn probe, the memory with every program graphed first in fresh processes, the graphs part.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 benchmarks/results/session49/churn_probe.py gelu:4096:4096 25 > $OUT/churn_gelu.log 2>&1; echo "churn rc=$?"
grep -E "capture again|measure again|judged|^-- step (9|24)" $OUT/churn_gelu.log | cut -c1-160
for c in gelu:4096:4096 swiglu:4096:4096; do
  timeout 100 python3 benchmarks/results/session46/shared_pool.py --cells $c --variants all_shared today torch > $OUT/fresh_${c//:/_}.log 2>&1
  echo "$c rc=$?"; tail -3 $OUT/fresh_${c//:/_}.log | cut -c1-200
done
LIMIT=240 bash benchmarks/run_gpu.sh graphs
