# Session 29, device call 2: a Sequential under torch.compile as two custom operators running the
# eager executor (fuseops/compiled_sequential.py, new). Its tests and the compile tests on torch
# 2.11 (CPU and GPU), then the dense sizes at T=1024 with the compiled column against torch.compile.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 280 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_compiled_sequential.py tests/test_compile.py \
  tests/test_compile_guards.py -m "gpu or not gpu" > $OUT/compile_tests.log 2>&1
echo "compile tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/compile_tests.log | cut -c1-250 | head -14; tail -1 $OUT/compile_tests.log; S=$SECONDS
timeout 250 python3 -m benchmarks.sizes --part dense --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_dense.log | cut -c1-220
