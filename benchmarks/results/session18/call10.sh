# Session 18, device call 10: call 9's mlp settled on 640 MiB (1152 in calls 3 and 8): settle
# from a fresh planner with the digest as a step begins, then deferred; print each plan.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 280 python3 benchmarks/results/session18/offload_ab.py --stacks mlp moe --rounds 4 --settle-both --variants none auto auto_nodefer > $OUT/offload_ab.log 2>&1; echo "ab rc=$?"
grep -E "^  (moe|mlp) |layer ms|planned" $OUT/offload_ab.log
