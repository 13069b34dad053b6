# Issue 24's table, both shapes, both FP8 recipes, one and eight micro-batches, then the casts against copy
# (benchmarks.quantize --quantize-only: the per-tensor cast given its amax). Run through calls.sh (OUT_PART).
S=$SECONDS
timeout 330 python3 -m benchmarks.fp8_moe --recipes "fp8 current" "fp8 blockwise" --rounds 3 \
  --out "$OUT_PART/fp8_moe.json" > "$OUT_PART/fp8_moe.log" 2>&1
echo "fp8_moe rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" "$OUT_PART/fp8_moe.log" | cut -c1-80; S=$SECONDS
timeout 200 python3 -m benchmarks.quantize --quantize-only --out "$OUT_PART" > "$OUT_PART/quantize.log" 2>&1
echo "quantize rc=$? ($((SECONDS - S)) s)"; grep -iE "copy|given|amax" "$OUT_PART/quantize.log" | cut -c1-160 | head -30
