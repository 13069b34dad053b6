# Session 33, call 2. Call 1's fp8layer part failed 14 tests: picked rows as int64 did not compile
# on the GPU (source_rows returned int64 or int32 by branch), and the device-assert test made its bad
# tensor inside sync-debug mode. Both mended: those tests again; then session 32's call 2 (Mixtral's
# FP8 table, the Qwen3 profile of layer against composition, the casts alone) with tighter limits.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/quant/test_quantize.py -k "picked_rows or bad_offsets" > $OUT/tests.log 2>&1
echo "picked-rows GPU tests rc=$? ($((SECONDS - S)) s)"; tail -2 $OUT/tests.log; S=$SECONDS
timeout 170 python3 -m benchmarks.fp8_moe --shapes mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe_mixtral.json > $OUT/fp8_moe_mixtral.log 2>&1
echo "fp8_moe mixtral rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_mixtral.log | cut -c1-120; S=$SECONDS
timeout 150 python3 -m benchmarks.moe_profile --shape qwen3-30b-a3b --impls "fuseops fp8" "fuseops fp8 layer" \
  --warmup-s 3 --top 30 > $OUT/moe_profile.log 2>&1
echo "moe_profile rc=$? ($((SECONDS - S)) s)"; grep -E "wall|^==|total" $OUT/moe_profile.log | cut -c1-200; S=$SECONDS
timeout 90 python3 -m benchmarks.moe_quantize > $OUT/moe_quantize_128.log 2>&1
echo "moe_quantize 128 groups rc=$? ($((SECONDS - S)) s)"; grep -E "copy |gathered|row amaxes|BITS" $OUT/moe_quantize_128.log | cut -c1-160; S=$SECONDS
timeout 70 python3 -m benchmarks.moe_quantize --experts 8 > $OUT/moe_quantize_8.log 2>&1
echo "moe_quantize 8 groups rc=$? ($((SECONDS - S)) s)"; grep -E "copy |block_r=128, block_c=64" $OUT/moe_quantize_8.log | cut -c1-160
