# Session 34, call 3 (prepared in session 33): issue 24. (a) At Mixtral with one micro-batch a step, the
# quantized layer was 0.5-0.7 ms slower than the composition in all three of session 33's runs (with eight it is
# 0.25-0.4 ms faster): the kernels of both with the weights updated after every step (their quantize in the step).
# (b) What is left at Qwen3 after session 33's cast change (FP8 current at 8 micro-batches: 12.8 ms against the
# 12.3-12.5 ms 1.3x needs). (c) The per-tensor cast's copies alone (is the transposed store its bound?).
# (d) First, the picked-row tests that failed in session 33's call 1 (int64 rows), mended but not re-run there.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/quant/test_quantize.py -k picked_rows > $OUT/picked_rows.log 2>&1
echo "picked-row tests rc=$? ($((SECONDS - S)) s)"; tail -2 $OUT/picked_rows.log; S=$SECONDS
timeout 200 python3 -m benchmarks.moe_profile --shape mixtral-8x7b --impls "fuseops fp8" "fuseops fp8 layer" --update \
  --warmup-s 3 --top 25 > $OUT/moe_profile_mixtral_update.log 2>&1
echo "moe_profile mixtral --update rc=$? ($((SECONDS - S)) s)"; grep -E "wall" $OUT/moe_profile_mixtral_update.log | cut -c1-200; S=$SECONDS
timeout 120 python3 -m benchmarks.moe_profile --shape qwen3-30b-a3b --impls "fuseops fp8 layer" --warmup-s 3 --top 25 \
  > $OUT/moe_profile_qwen3.log 2>&1
echo "moe_profile qwen3 rc=$? ($((SECONDS - S)) s)"; grep -A25 "wall" $OUT/moe_profile_qwen3.log | cut -c1-120; S=$SECONDS
timeout 100 python3 -m benchmarks.moe_quantize > $OUT/moe_quantize.log 2>&1
echo "moe_quantize rc=$? ($((SECONDS - S)) s)"; grep -E "copy |alone|gathered" $OUT/moe_quantize.log | cut -c1-160
