# Issue 20's noisiest host-bound cell (GELU T=1024 H=1024: rounds 1.10-1.48x in session 66's call 7) in three
# interleaved rounds again, after the near-maximum norm rows' CUDA check in the same call.
timeout ${DENSE_LIMIT:-200} python3 -m benchmarks.sizes --part dense --acts gelu --H 1024 --T 1024 --rounds 3 \
  --out "$OUT_PART/sizes_gelu_small" > "$OUT_PART/sizes_gelu_small.log" 2>&1; echo "gelu small rc=$?"
grep -E "^cell|^(gelu|swiglu) " "$OUT_PART/sizes_gelu_small.log" | cut -c1-140
