# Session 18, device call 16 (the before-stop hook's list): the quantize change where users
# start: the FP8 layer with float32 weights under torch.autocast, eager and compiled, at small
# token counts (against float64), and the FP8 layer table at T=1024 / 4096.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/results/session18/fp8_user_checks.py > $OUT/fp8_user_checks.log 2>&1; echo "checks rc=$?"
grep -E "^T=|Error|error" $OUT/fp8_user_checks.log | cut -c1-250 | tail -12
timeout 200 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b mixtral-8x7b --tokens 1024 4096 --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe_small.json > $OUT/fp8_moe_small.log 2>&1; echo "fp8_moe rc=$?"
grep -E "micro-batch|^[a-z].*\{" $OUT/fp8_moe_small.log | cut -c1-150
