# Session 28, device call 5: our custom operators through recorded programs (op_programs.py): their
# tests and the compile tests on torch 2.11, then the compiled MoE step's host time again.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 300 python3 -m pytest -q -p no:cacheprovider --tb=short tests/ops/executor/test_op_programs.py \
  tests/kernels/test_library.py tests/kernels/moe/test_traceable.py tests/test_compile.py tests/quant/test_compile.py -m gpu > $OUT/tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-250 | head -12; tail -1 $OUT/tests.log; S=$SECONDS
timeout 200 python3 benchmarks/results/session28/compiled_host.py moe:qwen3:1024 moe:olmoe:1024 > $OUT/compiled_host.log 2>&1
echo "compiled_host rc=$? ($((SECONDS - S)) s)"; grep -A6 "^| cell" $OUT/compiled_host.log | cut -c1-300; tail -2 $OUT/compiled_host.log | cut -c1-300; S=$SECONDS
timeout -s INT -k 10 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/ops/executor/test_op_programs.py tests/kernels/test_library.py tests/kernels/moe/test_traceable.py -m "not gpu" > $OUT/cpu_tests.log 2>&1
echo "cpu tests (torch 2.11) rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/cpu_tests.log | cut -c1-250 | head -12; tail -1 $OUT/cpu_tests.log
