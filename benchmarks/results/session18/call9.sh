# Session 18, device call 9: the settled digest deferred to the second group (issue 23), A/B
# against the digest as a step begins, moe and mlp; per-layer GPU times.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 250 python3 benchmarks/results/session18/offload_ab.py --stacks moe mlp --rounds 5 --variants none auto auto_nodefer > $OUT/offload_ab.log 2>&1; echo "ab rc=$?"
grep -E "^  (moe|mlp) |layer ms|planned" $OUT/offload_ab.log
