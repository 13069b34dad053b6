# Session 29, device call 13: the final compiled-Sequential code (backward saves the parameters
# only, its operator under no_grad, opcheck test, sharded Linears traced) on torch 2.11: its tests
# (CPU and GPU) and test_compile.py's GPU tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 170 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_compiled_sequential.py \
  tests/test_compile.py -m "gpu or not gpu" -k "compiled_sequential or gpu or cuda or opcheck" > $OUT/tests.log 2>&1
echo "tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -12; tail -1 $OUT/tests.log
