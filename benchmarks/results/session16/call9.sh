# Session 16, device call 9: the offload curve again, now printing what the last planned step
# moved per group beside the plan (issue 23: call 5 moved ~0.74x of the plan at mlp and moe).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 300 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
grep -E "^(mlp|attn|moe):|\* auto|auto:|auto planned|auto moved|interleaved" $OUT/offload.log | cut -c1-200
