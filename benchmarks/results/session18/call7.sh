# Session 18, device call 7: the moe stack's host time under "auto" (call 6: forward host
# 10.5 -> 18.0 ms a step, the first layer 1.1 ms longer on the GPU): cProfile by function.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 250 python3 benchmarks/results/session18/offload_ab.py --stacks moe --rounds 2 --variants none auto --profile > $OUT/offload_ab.log 2>&1; echo "ab rc=$?"
grep -A60 "cumulative, fuseops" $OUT/offload_ab.log | grep -v "^$" | cut -c1-150 | head -60
