# Session 27, device call 8: the rest of call 7's part (which ran past its limit in tests/test_compile_ops.py):
# the top-level test files but the two call 7 finished and test_torch_nn_behaviour.py (its GPU tests ran in
# session 26), every test, gpu-marked or not, on the device's torch 2.11.
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=dev
timeout -s INT -k 20 560 python3 -m pytest -p no:cacheprovider -rfE --tb=short -v tests/test_compile_ops.py \
  tests/test_compile_guards.py tests/test_fuser.py tests/test_sequential.py tests/test_compile.py > $OUT/top.log 2>&1
echo "top rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/top.log | cut -c1-200; tail -1 $OUT/top.log
grep -E "PASSED|SKIPPED|FAILED|ERROR" $OUT/top.log | sed 's/::.*//' | uniq -c
