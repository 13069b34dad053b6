# Session 26, device call 4: the MoE layer at T=1024 (kernels' floor, program phases), then issue 24's
# table where it stands (no FP8 change since session 19).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 benchmarks/results/session26/moe_small.py 1024 2>&1 | grep -v "Warn\|gc.get_objects\|return Variable\|^  warn"
echo "moe_small ($((SECONDS - S)) s)"; S=$SECONDS
timeout 400 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1; echo "fp8_moe rc=$? ($((SECONDS - S)) s)"
grep -E "micro-batch|^[a-z].*\{" $OUT/fp8_moe.log | cut -c1-150; tail -12 $OUT/fp8_moe.log | cut -c1-200
