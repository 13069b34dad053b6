# Session 66's CUDA tests of the norms' branch for rows whose squares overflow (never run: no device time left),
# with the register-capped configs (RMSNorm at 8192 columns, chunked rows).
timeout -s INT -k 20 ${SIDE_LIMIT:-240} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/kernels/elementwise/test_norm.py tests/kernels/elementwise/test_norm_quantize.py -k "large_finite_rows_on_cuda" \
  > "$OUT_PART/large_rows_gpu.log" 2>&1
echo "large_rows_gpu rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/large_rows_gpu.log" | cut -c1-200; tail -1 "$OUT_PART/large_rows_gpu.log"
