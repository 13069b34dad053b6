# Session 62: the float32 grouped GEMM tiles adopted from fp32_tiles2 (gated forward and wgrad: one tile per
# precision; grouped and gated dgrad: one for both): the grouped kernel tests in float32 (dtype0) on CUDA, the
# F32_DOT tests, the batched-cotangent compile tests on CUDA (inductor now compared with torch's own compiled model),
# then benchmarks/float32_precision.py against session 61's run 6 (the old tiles).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-200} python3 -m pytest -p no:cacheprovider -q -rfE tests/kernels/gemm/test_grouped.py \
  tests/kernels/gemm/test_grouped_gated.py tests/kernels/gemm/test_grouped_wgrad.py tests/kernels/gemm/test_float32_precision.py \
  tests/ops/executor/test_batched_cotangents.py -k "dtype0 or float32 or compiled_models_take and cuda" > "$OUT_PART/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT_PART/tests.log" | tail -8
timeout ${BENCH_LIMIT:-220} python3 -m benchmarks.float32_precision --rounds 2 --out "$OUT_PART/float32_precision" \
  > "$OUT_PART/bench.log" 2>&1
echo "bench rc=$?"; grep -v "^{" "$OUT_PART/bench.log" | tail -16
