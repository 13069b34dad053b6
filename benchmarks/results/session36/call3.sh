# Session 36, call 3: issue 24's FP8 layer as fp8_moe times it (an optimizer step of N micro-batches),
# profiled: how much of a Qwen3 micro-batch is idle GPU, and how much the gradient accumulation's
# adds cost (bf16 and FP8 alike); Mixtral's one-micro-batch layer against the composition launch by
# launch (call 2: the layer's grouped_gemm_scaled_kernel 8.17 ms a step against the composition's 7.64).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for spec in "qwen3-30b-a3b layer 8" "qwen3-30b-a3b bf16 8" "qwen3-30b-a3b layer 1" "mixtral-8x7b layer 1" "mixtral-8x7b composed 1"; do
  set -- $spec
  timeout 120 python3 -m benchmarks.step_gaps --model fp8 --fp8-shape $1 --impl $2 --micro-batches $3 --warmup 6 --steps 3 --top 14 --mark --out $OUT/gaps_fp8_$1_$2_$3.json 2>&1 | grep -v "Warning\|_warn_once" | tail -20 | cut -c1-400
done
echo "gaps ($((SECONDS - S)) s)"
