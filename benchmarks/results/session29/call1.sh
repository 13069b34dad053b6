# Session 29, device call 1: the FP8 capture lead (moe_profile prints what the graph states did
# during the profiled steps), then quantized CUDA edge cases not run since session 23.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 -m benchmarks.moe_profile --shape qwen3-30b-a3b --impls "fuseops fp8" "fuseops composed" > $OUT/moe_profile.log 2>&1
echo "moe_profile rc=$? ($((SECONDS - S)) s)"; S=$SECONDS
OUT=$OUT LIMIT=330 bash benchmarks/run_gpu.sh edge "Quantize and (one_row or dtype_max or non_contiguous) and not Grouped and not Gated"
echo "edge ($((SECONDS - S)) s)"; grep -E "PASSED|FAILED|ERROR" $OUT/edge.log | sed 's/.*test_edge_case_on_cuda//' | cut -c1-120
grep -iE "graph|capture|replay|state" $OUT/moe_profile.log | cut -c1-200 | head -30
