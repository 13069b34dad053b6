# Session 20, device call 5: the no-op `to` kept out of the traced references (fuseops/kernels/dtypes.py):
# on torch 2.11 the variants again, the compile tests (CPU and GPU), the expert layer's compile tests,
# and the quantized compile GPU tests (storage dequantize and the scaled GEMM references changed).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 benchmarks/results/session20/compile_variants2.py > $OUT/variants2.log 2>&1
echo "variants2 rc=$? ($((SECONDS - S)) s)"; grep -v Warn $OUT/variants2.log | grep -E "rel err|grad|raised|^2\." | cut -c1-250
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short"
timeout -s INT -k 10 300 $q tests/test_compile.py "tests/moe/test_expert_layer.py::test_compiles_without_graph_breaks" > $OUT/compile_tests.log 2>&1
echo "compile tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/compile_tests.log | cut -c1-200; tail -1 $OUT/compile_tests.log
timeout -s INT -k 10 $((560 - (SECONDS - S))) $q -m gpu tests/quant/test_compile.py > $OUT/quant_compile_gpu.log 2>&1
echo "quant compile gpu rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/quant_compile_gpu.log | cut -c1-200; tail -1 $OUT/quant_compile_gpu.log
