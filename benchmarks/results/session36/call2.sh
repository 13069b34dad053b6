# Session 36, call 2 (prepared in session 35): issue 24. (a) Mixtral with one micro-batch, where the
# quantized layer is 0.77 ms (FP8 current) / 0.97 ms (blockwise) slower than the composition in
# session 35 (call 2, call 11) and faster with eight: kernel breakdowns of both with the weights
# updated every step (moe_profile --update: each step re-quantizes them, as the one-micro-batch
# cadence does). (b) The Qwen3 FP8 current layer again (session 35: 1.27x at eight, 1.12-1.14x at one).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 -m benchmarks.moe_profile --shape mixtral-8x7b --impls "fuseops fp8 layer" "fuseops fp8" --update --steps 3 --warmup-s 5 --top 16 > $OUT/moe_profile_mixtral_update.log 2>&1
echo "moe_profile mixtral rc=$? ($((SECONDS - S)) s)"; grep -v "Warning\|_warn_once" $OUT/moe_profile_mixtral_update.log | tail -40 | cut -c1-150; S=$SECONDS
timeout 80 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_qwen3.json > $OUT/fp8_moe_qwen3.log 2>&1
echo "fp8_moe qwen3 rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_qwen3.log | cut -c1-120
# (c) Owed from session 35's end (its device time was spent): Mixtral FP8 current after the gathered
# tiling; the compile GPU tests on the wrapper without the cache; the quantized layer's GPU tests after
# quantize_derived took the recipe.
S=$SECONDS
timeout 90 python3 -m benchmarks.fp8_moe --shapes mixtral-8x7b --recipes "fp8 current" --rounds 2 --out $OUT/fp8_moe_mixtral.json > $OUT/fp8_moe_mixtral.log 2>&1
echo "fp8_moe mixtral rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_mixtral.log | cut -c1-120
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE -m gpu tests/test_compiled_sequential.py tests/test_compile.py tests/moe/test_expert_layer_quantized.py 2>&1 | tail -3
