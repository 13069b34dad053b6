# Session 49 run 14: fresh processes, every program graphed, with and without the wait, alternating (two rounds).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do for mode in nowait wait; do for c in gelu:4096:4096 swiglu:4096:4096; do
  echo "$round $mode $(timeout 60 python3 benchmarks/results/session49/fresh_ab.py $mode $c 2>&1 | tail -1 | cut -c1-190)"
done; done; done
