# The final MoE table: Qwen3, OLMoE, Mixtral x T=1024 / 4096 / 16384, uniform and skewed routing, two interleaved
# rounds (one round took ~210 s for 16 of 18 cells in session 65).
timeout ${MOE_LIMIT:-540} python3 -m benchmarks.sizes --part moe --rounds 2 \
  --out "$OUT_PART/sizes_moe" > "$OUT_PART/sizes_moe.log" 2>&1; echo "moe rc=$?"
grep -E "^cell|^(qwen3|olmoe|mixtral)" "$OUT_PART/sizes_moe.log" | cut -c1-170
