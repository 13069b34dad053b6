# Session 18, device call 6: moe under "auto" with and without the save notice, per-layer GPU
# times beside none's (issue 23).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 250 python3 benchmarks/results/session18/offload_ab.py --stacks moe --rounds 6 --variants none auto auto_nonotice > $OUT/offload_ab.log 2>&1; echo "ab rc=$?"
grep -E "^  (moe|mlp) |layer ms|planned" $OUT/offload_ab.log
