# Session 66 call 6: both A/Bs with the register caps in the norm + quantize forward too (no tests: call 4 ran them
# on the same kernels, the caps aside).
timeout ${AB_LIMIT:-200} python3 benchmarks/results/session66/norm_ab.py 2>&1 | grep -v Warn | tee "$OUT_PART/norm_ab.log"
timeout ${AB_LIMIT:-200} python3 benchmarks/results/session66/norm_quantize_ab.py 2>&1 | grep -v Warn | tee "$OUT_PART/norm_quantize_ab.log"
