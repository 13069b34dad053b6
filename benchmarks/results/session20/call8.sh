# Session 20, device call 8 (the last): on torch 2.11, every basic op alone compiled fullgraph against
# eager (CPU aot_eager and CUDA inductor: tests/test_compile_ops.py), the hooked-op fullgraph test, the
# traced-reference compile tests under tests/kernels (CPU), then as much of the models part of
# run_gpu.sh (fusions, integrations, offload; not run since session 17) as the call's time leaves.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short"
timeout -s INT -k 10 300 $q tests/test_compile_ops.py "tests/test_compile.py::test_a_hooked_op_compiles_fullgraph_and_its_hook_fires" \
  tests/kernels/gemm/test_traced.py tests/kernels/moe/test_traceable.py tests/ops/test_shape.py > $OUT/compile_ops.log 2>&1
echo "compile ops rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/compile_ops.log | cut -c1-200; tail -1 $OUT/compile_ops.log
LIMIT=$((585 - (SECONDS - S))) bash benchmarks/run_gpu.sh models
grep -cE "PASSED|FAILED|ERROR|SKIPPED" $OUT/models.log; grep -E "PASSED|FAILED|SKIPPED" $OUT/models.log | tail -1 | cut -c1-150
