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
# The casts alone at Qwen3's shapes: the gathered cast and the tokens' row amaxes against the composition's
# cast and amax pass (bit for bit checked), and the 128-group cast against the same rows in 8 groups (whether
# the group search of each program, 128 offsets at 128 groups, is why the cast runs at ~0.6 of copy there).
S=$SECONDS
timeout 150 python3 -m benchmarks.moe_quantize > $OUT/moe_quantize_128.log 2>&1
echo "moe_quantize 128 groups rc=$? ($((SECONDS - S)) s)"; grep -E "copy |gathered|row amaxes|BITS" $OUT/moe_quantize_128.log | cut -c1-160; S=$SECONDS
timeout 100 python3 -m benchmarks.moe_quantize --experts 8 > $OUT/moe_quantize_8.log 2>&1
echo "moe_quantize 8 groups rc=$? ($((SECONDS - S)) s)"; grep -E "copy |block_r=128, block_c=64" $OUT/moe_quantize_8.log | cut -c1-160
