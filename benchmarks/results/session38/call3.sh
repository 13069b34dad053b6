# Session 38, call 3: the per-tensor FP8 forward / dgrad routed to the ping-pong kernel (now
# hopper/tensor_scaled.py; the cooperative per-tensor path of fp8_forward.py gone: offline for sm_90a
# the blockwise kernel's SASS is unchanged) and the per-tensor wgrad to hopper/tensor_scaled_wgrad.py
# (call 2's A/B). Session 37's call 2 then: the GPU tests of everything the FP8 GEMMs serve, the main_grad
# tests on torch 2.11 (CPU and GPU), issue 24's benchmark at both shapes (FP8 current), and the layer
# at small / medium token counts. ~9.5 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 250 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/kernels/hopper \
  -m gpu tests/kernels/gemm/test_grouped_scaled.py tests/moe/test_expert_layer_quantized.py \
  tests/ops/test_quantized_non_finite.py tests/quant/test_accuracy.py tests/fusions/test_forward_quantized_grouped_mlp.py \
  tests/quant/test_compile.py tests/ops/executor/test_autocast_weight_grads.py \
  2>&1 | tee $OUT/gpu_tests.log | tail -6 | cut -c1-300
echo "tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout -s INT 110 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/test_compiled_sequential.py \
  tests/moe/test_expert_layer.py tests/moe/test_routing_graphs.py -k main_grad 2>&1 | tail -4 | cut -c1-300
echo "main_grad tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 150 python3 -m benchmarks.fp8_moe --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_current.json > $OUT/fp8_moe_current.log 2>&1
echo "fp8_moe rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_current.log | cut -c1-120; S=$SECONDS
timeout 70 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --tokens 1024 4096 --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_small.json > $OUT/fp8_moe_small.log 2>&1
echo "fp8_moe small rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_small.log | cut -c1-120
