# quantize_eager.py (~1 min): the FP8 blockwise column-wise cast's eager time against its graph's.
timeout 120 python3 benchmarks/results/session55/quantize_eager.py 2>&1 | grep -v Warn | tee "$OUT_PART/quantize_eager.log"
