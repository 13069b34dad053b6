# Session 17, device call 9: the offload planner's early copies (issue 23): GPU offload tests
# and the benchmark (three stacks).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT 150 $q tests/offload > $OUT/tests_offload.log 2>&1
echo "offload tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_offload.log | cut -c1-220; tail -1 $OUT/tests_offload.log
timeout 300 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
grep -E "^(mlp|attn|moe):|auto|none |all " $OUT/offload.log | grep -v "auto profile" | cut -c1-300
