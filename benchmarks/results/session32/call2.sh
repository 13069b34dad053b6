# Second call: the same table at Mixtral, then where the quantized layer's step goes at Qwen3 (kernel by
# kernel, against the FP8 composition: the permute / unpermute copies and the x / dy amax passes should be
# gone, row_amax and the gathered casts in their place).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 300 python3 -m benchmarks.fp8_moe --shapes mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe_mixtral.json > $OUT/fp8_moe_mixtral.log 2>&1
echo "fp8_moe mixtral rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_mixtral.log | cut -c1-120; S=$SECONDS
timeout 200 python3 -m benchmarks.moe_profile --shape qwen3-30b-a3b --impls "fuseops fp8" "fuseops fp8 layer" \
  --warmup-s 3 --top 30 > $OUT/moe_profile.log 2>&1
echo "moe_profile rc=$? ($((SECONDS - S)) s)"; grep -E "wall|^==|total" $OUT/moe_profile.log | cut -c1-200
