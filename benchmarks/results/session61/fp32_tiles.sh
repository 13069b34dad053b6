# Session 61: fp32_tiles.py (float32 grouped GEMM tile candidates under "ieee" and "tf32").
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TILES_LIMIT:-170} python3 benchmarks/results/session61/fp32_tiles.py ${SWEEP_S:-140} 2>&1 | tee "$OUT_PART/tiles.log" | tail -16
