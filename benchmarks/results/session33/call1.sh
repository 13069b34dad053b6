# For the first device call after session 32 (which had no device time): the issue-24 change on the GPU.
# expert_layer under a recipe is now one quantized Function that quantizes the permuted tokens and their
# gradients straight from x and dy (fuseops/moe/expert_layer_quantized.py). Its GPU tests (the new kernels'
# GATHER specializations and row_amax compile here), then the FP8 MoE table at Qwen3: the layer, the
# composition (the path before it, "... composed") and bf16, at 1 and 8 micro-batches, in one run.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
LIMIT=270 bash benchmarks/run_gpu.sh fp8layer
echo "fp8layer tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 270 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe_qwen3.json > $OUT/fp8_moe_qwen3.log 2>&1
echo "fp8_moe qwen3 rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_qwen3.log | cut -c1-120
