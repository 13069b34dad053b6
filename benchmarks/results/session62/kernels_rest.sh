# Session 62: the float32 GPU tests at two sizes (test_float32_precision.py, the new tiles), then the kernels part's
# files that session 62's call 3 (540 s, 219 passed) did not reach, in collection order after test_grouped_scaled_act.
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-dev}
timeout 120 python3 -m pytest -p no:cacheprovider -q -rfE -m gpu tests/kernels/gemm/test_float32_precision.py \
  > "$OUT_PART/float32.log" 2>&1
echo "float32 rc=$?"; tail -1 "$OUT_PART/float32.log"
timeout -s INT -k 20 ${LIMIT:-320} python3 -m pytest -p no:cacheprovider -rfE --tb=short -v -m gpu \
  tests/kernels/gemm/test_grouped_scaled_dgrad_gated.py tests/kernels/gemm/test_grouped_scaled_wgrad.py \
  tests/kernels/gemm/test_grouped_wgrad.py tests/kernels/gemm/test_tma_checks.py tests/kernels/gemm/test_traced.py \
  tests/kernels/gemm/test_wgrad_walk.py tests/kernels/moe tests/kernels/quantization \
  --ignore=tests/kernels/quantization/test_quantize.py tests/kernels/test_dense_dispatch.py tests/kernels/test_dispatch.py \
  tests/kernels/test_launch.py tests/kernels/test_launch_capture.py tests/kernels/test_launch_descriptors.py \
  tests/kernels/test_library.py > "$OUT_PART/rest.log" 2>&1
echo "rest rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/rest.log" | cut -c1-200; tail -1 "$OUT_PART/rest.log"
