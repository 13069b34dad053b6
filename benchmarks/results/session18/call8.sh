# Session 18, device call 8: the scheduler's host time a step by entry point, group 0 apart
# (issue 23: the moe stack's first layer is 0.7 ms longer on the GPU under "auto").
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 250 python3 benchmarks/results/session18/offload_ab.py --stacks moe mlp --rounds 2 --variants none auto --host-breakdown > $OUT/offload_ab.log 2>&1; echo "ab rc=$?"
grep -E "^  (moe|mlp) |layer ms|==|us a step" $OUT/offload_ab.log
