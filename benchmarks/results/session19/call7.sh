# Session 19, device call 7: why the quantized layer's fullgraph compile fails on torch 2.11
# (vt_debug.py), the dense/grouped compile GPU tests after the dispatch-key change, and the quantize
# kernel GPU tests after the BLOCK row-wise config change (4 warps, 128 registers).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 120 python3 benchmarks/results/session19/vt_debug.py FP8Blockwise bf16 2>&1 | grep -v "Warn\|warn" | tail -25
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/test_compile.py > $OUT/compile_tests.log 2>&1
echo "compile gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/compile_tests.log | cut -c1-250; tail -1 $OUT/compile_tests.log
LIMIT=$((560 - (SECONDS - S))) OUT=$OUT bash benchmarks/run_gpu.sh quantize
