# Session 18, device call 12: the quantize kernel's plain path and rare path (helper's merge,
# issue 24): ratio to a device copy, the FP8 layer table at both shapes and cadences, then the
# GPU quantize tests and the CUDA quantize edge cases.
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short"
timeout 110 python3 -m benchmarks.quantize --quantize-only --out $OUT/quantize.json > $OUT/quantize.log 2>&1; echo "quantize rc=$?"
grep -E "copy |blockwise|mxfp8|nvfp4|fp8_current" $OUT/quantize.log | grep -v "^{" | cut -c1-120
timeout 150 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1; echo "fp8_moe rc=$?"
grep -E "micro-batch|^[a-z].*\{" $OUT/fp8_moe.log | cut -c1-150
timeout -s INT -k 10 200 $q -m gpu tests/kernels/quantization/test_quantize.py > $OUT/tests_quantize.log 2>&1
echo "gpu quantize tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_quantize.log | cut -c1-220; tail -1 $OUT/tests_quantize.log
timeout -s INT -k 10 110 $q tests/quant/test_quantize.py -k "non_finite or dtype_max or kernels_match" > $OUT/tests_quant.log 2>&1
echo "quant tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_quant.log | cut -c1-220; tail -1 $OUT/tests_quant.log
