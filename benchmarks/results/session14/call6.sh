# Session 14, device call 6: the offload planner after the s14-offload fixes (issue 23): GPU
# tests, then the curve with host time per step and the hooks-only point.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 110 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/offload \
  > $OUT/offload_tests.log 2>&1
echo "offload tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/offload_tests.log | cut -c1-200; tail -1 $OUT/offload_tests.log
timeout 250 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
grep -B1 -A13 "^mlp\|^attn\|^moe" $OUT/offload.log | cut -c1-160 | head -60
