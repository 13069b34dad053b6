# Session 64: the activation op tests again on torch 2.11 (CPU and CUDA) after the bit-for-bit tests compare with
# float64 where torch's kernels are wrong (run 3: torch 2.11's CPU GELU forward at +inf and 3e38).
timeout -s INT -k 20 ${SIDE_LIMIT:-150} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/ops/test_activation.py tests/ops/test_gated.py > "$OUT_PART/refs4.log" 2>&1
echo "refs4 rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/refs4.log" | cut -c1-200; tail -1 "$OUT_PART/refs4.log"
