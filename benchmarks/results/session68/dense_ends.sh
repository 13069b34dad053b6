# The final dense table's other rows: T=1024 (host-bound; three interleaved rounds) and T=16384 (GPU-bound; two), every
# H and both activations. T=4096 is dense_medium.
timeout ${DENSE_SMALL_LIMIT:-200} python3 -m benchmarks.sizes --part dense --T 1024 --rounds 3 \
  --out "$OUT_PART/sizes_dense_t1024" > "$OUT_PART/sizes_dense_t1024.log" 2>&1; echo "dense T=1024 rc=$?"
grep -E "^cell|^(gelu|swiglu) " "$OUT_PART/sizes_dense_t1024.log" | cut -c1-160
timeout ${DENSE_LARGE_LIMIT:-350} python3 -m benchmarks.sizes --part dense --T 16384 --rounds 2 \
  --out "$OUT_PART/sizes_dense_t16384" > "$OUT_PART/sizes_dense_t16384.log" 2>&1; echo "dense T=16384 rc=$?"
grep -E "^(gelu|swiglu) " "$OUT_PART/sizes_dense_t16384.log" | cut -c1-160
