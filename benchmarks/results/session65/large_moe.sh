# Issue 20's cells not timed since session 64's changes: dense T=16384 (H=1024 / 2048 / 4096) and H=4096 T=4096, then
# the MoE layer (Qwen3, OLMoE, Mixtral x T=1024 / 4096 / 16384); one round each (the budget), bf16.
timeout ${DENSE_LIMIT:-260} python3 -m benchmarks.sizes --part dense --T 16384 --H 1024 2048 4096 --rounds 1 \
  --out "$OUT_PART/sizes_dense_t16384" > "$OUT_PART/sizes_dense_t16384.log" 2>&1; echo "dense T=16384 rc=$?"
grep -E "^cell|^(gelu|swiglu) " "$OUT_PART/sizes_dense_t16384.log" | cut -c1-120
timeout ${DENSE4_LIMIT:-80} python3 -m benchmarks.sizes --part dense --T 4096 --H 4096 --rounds 1 \
  --out "$OUT_PART/sizes_dense_h4096" > "$OUT_PART/sizes_dense_h4096.log" 2>&1; echo "dense H=4096 T=4096 rc=$?"
grep -E "^(gelu|swiglu) " "$OUT_PART/sizes_dense_h4096.log" | cut -c1-120
timeout ${MOE_LIMIT:-200} python3 -m benchmarks.sizes --part moe --rounds 1 \
  --out "$OUT_PART/sizes_moe" > "$OUT_PART/sizes_moe.log" 2>&1; echo "moe rc=$?"
grep -E "^cell|^(qwen3|olmoe|mixtral)" "$OUT_PART/sizes_moe.log" | cut -c1-140
