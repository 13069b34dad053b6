# Session 62: fp32_tiles2.py (every grouped kernel's float32 tiles; tf32, ieee, tf32x3).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TILES_LIMIT:-400} python3 benchmarks/results/session62/fp32_tiles2.py ${SWEEP_S:-360} 2>&1 | tee "$OUT_PART/tiles.log" | grep -v "^  "
