# Session 64: more dense cells, eager and compiled, one round (issue 20's compiled target): T=4096 at H=1024 / 2048,
# then H=4096 at T=1024 (sizes.py; each table printed last).
timeout ${SIZES_LIMIT:-150} python3 -m benchmarks.sizes --part dense --H 1024 2048 --T 4096 --rounds 1 \
  --out "$OUT_PART/sizes_t4096" > "$OUT_PART/sizes_t4096.log" 2>&1; echo "sizes T=4096 rc=$?"
grep -A6 "^cell" "$OUT_PART/sizes_t4096.log" | cut -c1-140
timeout ${SIZES_LIMIT2:-100} python3 -m benchmarks.sizes --part dense --H 4096 --T 1024 --rounds 1 \
  --out "$OUT_PART/sizes_h4096" > "$OUT_PART/sizes_h4096.log" 2>&1; echo "sizes H=4096 rc=$?"
grep -A4 "^cell" "$OUT_PART/sizes_h4096.log" | cut -c1-140
