# Issue 23's benchmark (three stacks, "auto" against no offload, 5 interleaved rounds; ~4 min): not run since session
# 23, before CUDA graphs of recorded programs became the default (session 50).
timeout 300 python3 -m benchmarks.offload --steps 6 --rounds 5 --out "$OUT_PART/offload3" > "$OUT_PART/offload3.log" 2>&1
echo "offload rc=$?"
grep -E "^(mlp|attn|moe):|\* auto|^ +none|^ +all|against none" "$OUT_PART/offload3.log" | cut -c1-200
