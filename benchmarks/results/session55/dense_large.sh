# sizes.py dense H=4096, every T (~5 min): the issue-20 cells session 55 did not run.
timeout 420 python3 -m benchmarks.sizes --part dense --H 4096 --rounds 2 --out "$OUT_PART/sizes_dense_h4096" \
  > "$OUT_PART/sizes_dense_h4096.log" 2>&1; echo "sizes rc=$?"
grep -E "^cell|^(gelu|swiglu) |CUDA-graph" "$OUT_PART/sizes_dense_h4096.log" | cut -c1-220
