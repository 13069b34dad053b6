# Session 34, call 8: call 7's tiling only for grouped casts of rows read in place (h and dz in the quantized
# layer; x_sorted / dy_sorted in the composition), the gathered casts and the weights' back at 128x64: the
# quantized layer at Qwen3 against bf16 (issue 24).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_qwen3.json > $OUT/fp8_moe_qwen3.log 2>&1
echo "fp8_moe qwen3 rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_qwen3.log | cut -c1-120
