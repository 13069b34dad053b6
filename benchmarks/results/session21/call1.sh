# Session 21, device call 1: where issues 23 and 24 stand on this machine (untouched since session
# 19): the offload curve of the three stacks, with the hooks alone interleaved beside none and auto;
# a profile of the moe stack (idle, kernels, copies: none / hooks / tenth / auto); the FP8 MoE table;
# then the models part of run_gpu.sh without the edge cases (they stopped call 8 of session 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 280 python3 -m benchmarks.offload --out $OUT --steps 6 --rounds 5 > $OUT/offload.log 2>&1; echo "offload rc=$? ($((SECONDS - S)) s)"
grep -E "^(mlp|attn|moe):|auto|none |all |hooks " $OUT/offload.log | grep -v "auto profile" | cut -c1-220
timeout 100 python3 -m benchmarks.offload_profile --stacks moe > $OUT/offload_profile.log 2>&1; echo "offload_profile rc=$? ($((SECONDS - S)) s)"
tail -12 $OUT/offload_profile.log | cut -c1-220
timeout $((480 - (SECONDS - S))) python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1; echo "fp8_moe rc=$? ($((SECONDS - S)) s)"
grep -E "micro-batch|^[a-z].*\{" $OUT/fp8_moe.log | cut -c1-150
if [ $((SECONDS - S)) -lt 500 ]; then
  LIMIT=$((585 - (SECONDS - S))) bash benchmarks/run_gpu.sh models -k "not test_edge_cases"
fi
