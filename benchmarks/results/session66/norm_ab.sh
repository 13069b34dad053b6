# Session 66: the norm change reworked (the common path as before a1cfaa3, overflowed rows in a branch): its tests on
# CUDA, then the forward A/B of the module before session 65's change, now, and now without its register caps.
timeout -s INT -k 20 ${SIDE_LIMIT:-240} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/kernels/elementwise/test_norm.py tests/kernels/elementwise/test_norm_quantize.py tests/ops/test_norm.py \
  > "$OUT_PART/norm_gpu.log" 2>&1
echo "norm_gpu rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/norm_gpu.log" | cut -c1-200; tail -1 "$OUT_PART/norm_gpu.log"
timeout ${AB_LIMIT:-200} python3 benchmarks/results/session66/norm_ab.py 2>&1 | grep -v Warn | tee "$OUT_PART/norm_ab.log"
