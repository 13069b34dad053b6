# Session 29, device call 6: the compiled Sequential's tests again (a real call's layout checked
# cheaply, the trace's template reparametrized), and why the compiled dense stack was slower than
# eager in call 5 (graph states per phase).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_compiled_sequential.py \
  tests/test_compile.py -m "gpu or not gpu" -k "grouped or compiled_sequential or bit_for_bit or gpu" > $OUT/compile_tests.log 2>&1
echo "compile tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/compile_tests.log | cut -c1-300 | head -14; tail -1 $OUT/compile_tests.log; S=$SECONDS
timeout 150 python3 benchmarks/results/session29/compiled_states.py 2>&1 | grep -v Warn | tail -6
echo "states ($((SECONDS - S)) s)"
