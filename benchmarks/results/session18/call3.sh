# Session 18, device call 3: the moe stack's forward under "auto" (call 2: +1.25 ms, 1.076x):
# host time of forward and backward beside GPU time, and cProfile of the host for none / auto.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 250 python3 benchmarks/results/session18/offload_ab.py --stacks moe mlp --rounds 4 --variants none auto auto_late --profile > $OUT/offload_ab.log 2>&1; echo "ab rc=$?"
grep -E "^  (moe|mlp) " $OUT/offload_ab.log
