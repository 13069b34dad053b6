# Session 16, device call 2: the quantize kernel tests and bandwidth after the TENSOR+column-wise
# tile change (128x64, issue 24), and the offload curve after the planner's frozen re-plan (issue 23).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 170 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/kernels/quantization/test_quantize.py \
  > $OUT/tests_quantize.log 2>&1
echo "quantize tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_quantize.log | cut -c1-220; tail -1 $OUT/tests_quantize.log
timeout 100 python3 -m benchmarks.quantize --quantize-only --out $OUT/quantize.json > $OUT/quantize.log 2>&1; echo "quantize rc=$?"
timeout 280 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
tail -25 $OUT/quantize.log | cut -c1-140
grep -B1 -A14 "^mlp\|^attn\|^moe" $OUT/offload.log | cut -c1-160 | head -60
grep -A8 "auto planned" $OUT/offload.log | cut -c1-200 | head -30
