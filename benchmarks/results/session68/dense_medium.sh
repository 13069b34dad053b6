# The medium dense cells (T=4096, H in {1024, 2048, 4096}, GELU and SwiGLU), three interleaved rounds: not measured
# since session 66's norm rework.
timeout ${DENSE_LIMIT:-420} python3 -m benchmarks.sizes --part dense --T 4096 --rounds 3 \
  --out "$OUT_PART/sizes_dense_medium" > "$OUT_PART/sizes_dense_medium.log" 2>&1; echo "dense medium rc=$?"
grep -E "^cell|^(gelu|swiglu) " "$OUT_PART/sizes_dense_medium.log" | cut -c1-160
