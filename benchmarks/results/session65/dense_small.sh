# Issue 20's host-bound dense cells (T=1024, H=1024 / 2048) in three interleaved rounds: one round a cell moved the
# eager ratio 1.12-1.55x between rounds of one cell in session 65's run 3 (target 1.2x there).
timeout ${DENSE_LIMIT:-540} python3 -m benchmarks.sizes --part dense --H 1024 2048 --T 1024 --rounds 3 \
  --out "$OUT_PART/sizes_dense_small" > "$OUT_PART/sizes_dense_small.log" 2>&1; echo "dense small rc=$?"
grep -E "^cell|^(gelu|swiglu) " "$OUT_PART/sizes_dense_small.log" | cut -c1-140
