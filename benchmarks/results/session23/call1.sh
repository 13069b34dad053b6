# Session 23, device call 1: what session 22 merged after its last device call. Issue 23's three stacks
# with replay under offload (offloaded forwards now replay too; session 22 call 7 is the baseline: moe
# 1.033x); the inference replay (no_grad forwards) bitwise and timed; then the models part of the GPU
# suite (fusions, integrations, offload) without the edge cases.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 230 python3 -m benchmarks.offload --steps 6 --rounds 5 --out $OUT/offload3 > $OUT/offload3.log 2>&1
echo "3 stacks rc=$? ($((SECONDS - S)) s)"
grep -E "^(mlp|attn|moe):|\* auto|^ +none|^ +all|against none" $OUT/offload3.log | cut -c1-200
timeout 90 python3 benchmarks/results/session23/replay_ab.py --no-grad --reps 20 --rounds 3 > $OUT/replay_nograd.log 2>&1
echo "replay no_grad rc=$? ($((SECONDS - S)) s)"; grep -v Warning $OUT/replay_nograd.log | grep -v "return torch" | cut -c1-200
LIMIT=$((585 - (SECONDS - S))) bash benchmarks/run_gpu.sh models -k "not test_edge_cases"
echo "total $((SECONDS - S)) s"
