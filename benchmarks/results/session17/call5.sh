# Session 17, device call 5: the step-level offload plan (issue 23: GPU offload tests and the
# benchmark), the compile GPU tests with the routing custom ops (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT 150 $q tests/offload > $OUT/tests_offload.log 2>&1
echo "offload tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_offload.log | cut -c1-220; tail -1 $OUT/tests_offload.log
timeout -s INT 150 $q tests/test_compile.py > $OUT/tests_compile.log 2>&1
echo "compile tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_compile.log | cut -c1-220; tail -1 $OUT/tests_compile.log
timeout 280 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
grep -B1 -A14 "^mlp\|^attn\|^moe" $OUT/offload.log | cut -c1-160 | head -60
grep -A8 "auto planned" $OUT/offload.log | cut -c1-200 | head -30
