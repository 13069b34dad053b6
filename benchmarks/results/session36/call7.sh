# Session 36, call 7: hopper/tensor_scaled.py routed (the dispatch table's sm_90 row for FP8
# per-tensor grouped GEMMs, bf16 / fp16 out). Its tests and the GPU tests of what goes through it
# (the grouped scaled GEMMs, the quantized expert layer and MLP fusions, non-finite inputs,
# accuracy); then issue 24's benchmark at both shapes (call 6: the kernel 1.06-1.09x the Triton
# one on the Qwen3 forward and dgrad GEMMs).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 260 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/kernels/hopper/test_tensor_scaled.py 2>&1 | tail -4 | cut -c1-300
timeout -s INT 200 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/kernels/gemm/test_grouped_scaled.py tests/moe/test_expert_layer_quantized.py tests/ops/test_quantized_non_finite.py tests/quant/test_accuracy.py tests/fusions/test_forward_quantized_grouped_mlp.py 2>&1 | tail -8 | cut -c1-300
echo "tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 150 python3 -m benchmarks.fp8_moe --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_gluon.json > $OUT/fp8_moe_gluon.log 2>&1
echo "fp8_moe rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch|cached, uncached" $OUT/fp8_moe_gluon.log | cut -c1-120
