# Session 66: the norm + quantize forward before session 65's change and now (norm_quantize_ab.py).
timeout ${AB_LIMIT:-240} python3 benchmarks/results/session66/norm_quantize_ab.py 2>&1 | grep -v Warn | tee "$OUT_PART/norm_quantize_ab.log"
