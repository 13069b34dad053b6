# Session 19, device call 8: the offload scheduler's host trims (helper-30: notice.py, block-fence
# waits, start-mark reuse): GPU offload tests and the benchmark (5 interleaved rounds); the
# quantized layer's fullgraph compile on torch 2.11 after the assert-message fix.
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
S=$SECONDS
timeout -s INT -k 10 120 $q tests/offload > $OUT/tests_offload.log 2>&1
echo "offload gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests_offload.log | cut -c1-220; tail -1 $OUT/tests_offload.log
timeout 300 python3 -m benchmarks.offload --out $OUT --steps 6 --rounds 5 > $OUT/offload.log 2>&1; echo "offload rc=$? ($((SECONDS - S)) s)"
grep -E "^(mlp|attn|moe):|auto|none |all " $OUT/offload.log | grep -v "auto profile" | cut -c1-300
timeout -s INT -k 10 $((585 - (SECONDS - S))) $q tests/quant/test_compile.py > $OUT/tests_compile.log 2>&1
echo "quantized compile gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests_compile.log | cut -c1-220; tail -1 $OUT/tests_compile.log
