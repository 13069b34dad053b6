# Session 18, device call 13: where the FP8 layer's step goes after the quantize fix (issue 24):
# kernel times by name, Mixtral and Qwen3, blockwise / current / bf16.
export PYTHONPATH=. PYTHONUNBUFFERED=1
for shape in mixtral-8x7b qwen3-30b-a3b; do
  timeout 140 python3 -m benchmarks.moe_profile --shape $shape --impls "fuseops fp8 blk" "fuseops fp8" fuseops --steps 5 --warmup-s 3 --top 12 > $OUT/moe_profile_$shape.log 2>&1
  echo "$shape rc=$?"; grep -v Warn $OUT/moe_profile_$shape.log | grep -v "_warn_once" | cut -c1-110
done
