# Session 49 run 7: the keep rule with the graph's span capped at the eager one's plus its copies' (FUSEOPS_CUDA_GRAPHS=all
# at GPU-bound dense cells: drops and the old rule's verdicts), then the graphs part of the GPU tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for c in gelu:4096:4096 swiglu:4096:4096 gelu:16384:4096; do
  echo "== $c"
  timeout 120 python3 benchmarks/results/session49/keep_probe.py $c > $OUT/keep_${c//:/_}.log 2>&1
  echo rc=$?
  grep -c -- "->graphed" $OUT/keep_${c//:/_}.log; grep -E -- "->(eager|measuring)|'drop'" $OUT/keep_${c//:/_}.log | cut -c1-260
  grep "^step [35]9" $OUT/keep_${c//:/_}.log | cut -c1-200
done
LIMIT=300 bash benchmarks/run_gpu.sh graphs
