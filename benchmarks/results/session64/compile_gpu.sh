# Session 64's settings_key (what a compiled graph guards per op) and the GELU references' final form (no host read)
# on torch 2.11: the compile tests (CPU cases too: torch 2.11's dynamo) and the activation tests, CPU and CUDA.
timeout -s INT -k 20 ${SIDE_LIMIT:-300} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/test_compile.py tests/test_compiled_sequential.py tests/test_compile_guards.py tests/test_call_cache.py \
  tests/ops/test_activation.py tests/ops/test_gated.py > "$OUT_PART/compile_gpu.log" 2>&1
echo "compile_gpu rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/compile_gpu.log" | cut -c1-200; tail -1 "$OUT_PART/compile_gpu.log"
