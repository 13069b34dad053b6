# Session 20 (issue 20): the compiled dense stack's step and guard time, base (main before the merge) against this
# branch on one machine (A then B, REPS times); guard counts under the device's torch; the compile
# tests, GPU and CPU (the CPU ones check torch 2.11's handling of assume_constant_result).
# Before the run, here: mkdir -p build/base && git archive e4234c5b8d0097eeec815afd5ad86f9f6138bd09 fuseops | tar -x -C build/base
# and carry build/base.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for _ in $(seq "${REPS:-1}"); do
  for r in build/base .; do
    FUSEOPS_ROOT=$r timeout 200 python3 benchmarks/results/session20/compiled_gap.py 1024,1024 4096,1024 2>&1 \
      | grep -E "^fuseops from|^T="
  done
done
for r in build/base .; do
  FUSEOPS_ROOT=$r timeout 120 python3 benchmarks/results/session20/guard_count.py 2>&1 | grep -E "^torch|^\S|leaf"
done
echo "benchmarks done ($((SECONDS - S)) s)"
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short"
timeout -s INT -k 10 200 $q -m gpu tests/test_compile.py > $OUT/tests_compile_gpu.log 2>&1
echo "compile gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests_compile_gpu.log | cut -c1-220; tail -1 $OUT/tests_compile_gpu.log
timeout -s INT -k 10 200 $q -m "not gpu" tests/test_compile_guards.py tests/test_compile.py tests/kernels/test_dispatch.py \
  > $OUT/tests_compile_cpu.log 2>&1
echo "compile cpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests_compile_cpu.log | cut -c1-220; tail -1 $OUT/tests_compile_cpu.log
