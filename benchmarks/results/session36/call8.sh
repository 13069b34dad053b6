# Session 36, call 8 (run inline, on call 7's warm machine): the rest of call 7's GPU test
# selection, and issue 24's Qwen3 benchmark again.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 130 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/quant/test_accuracy.py tests/fusions/test_forward_quantized_grouped_mlp.py tests/ops/test_quantized_non_finite.py
timeout 100 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_gluon_qwen3_2.json > $OUT/fp8_moe_gluon_qwen3_2.log 2>&1
