# Session 19, device call 10: the eager quantized path after the custom-op change (call sites now
# ask quantized_launcher): CUDA tests of tests/quant and tests/ops' quantized files, the quantized
# fusion GPU tests, then the FP8 MoE table (issue 24) with the BLOCK row-wise quantize config.
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
S=$SECONDS
timeout -s INT -k 10 150 $q tests/quant --ignore=tests/quant/test_compile.py tests/ops/test_quantized_non_finite.py > $OUT/tests_quant.log 2>&1
echo "quant gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests_quant.log | cut -c1-220; tail -1 $OUT/tests_quant.log
timeout -s INT -k 10 240 $q tests/fusions/test_forward_quantized_grouped_mlp.py tests/fusions/test_backward_quantized_gated_mlp.py tests/fusions/test_backward_gated_amax_linear.py > $OUT/tests_fusions.log 2>&1
echo "quantized fusion gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests_fusions.log | cut -c1-220; tail -1 $OUT/tests_fusions.log
timeout $((580 - (SECONDS - S))) python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1; echo "fp8_moe rc=$? ($((SECONDS - S)) s)"
grep -E "micro-batch|^[a-z].*\{" $OUT/fp8_moe.log | cut -c1-150
