# Session 20, device call 4: localise torch 2.11's zero gradient (compile_variants2.py: dense
# Sequential variants; the expert layer's row sum variations), then the quantized compile tests'
# CPU half on torch 2.11.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 benchmarks/results/session20/compile_variants2.py > $OUT/variants2.log 2>&1
echo "variants2 rc=$? ($((SECONDS - S)) s)"; grep -v Warn $OUT/variants2.log | grep -E "rel err|grad|raised|^2\." | cut -c1-250
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short"
timeout -s INT -k 10 $((540 - (SECONDS - S))) $q tests/quant/test_compile.py -m "not gpu" > $OUT/quant_compile_cpu.log 2>&1
echo "quant compile cpu rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/quant_compile_cpu.log | cut -c1-200; tail -1 $OUT/quant_compile_cpu.log
