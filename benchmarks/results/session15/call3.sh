# Session 15, device call 3: compile after the Role hash fix, the offload tests and curve after
# the planner's re-plan (issue 23), and a cProfile of the dense block's host path (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 170 env FUSEOPS_CHECK_LAUNCH=1 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/test_compile.py \
  tests/offload > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | cut -c1-220; tail -1 $OUT/tests.log
timeout 270 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
timeout 60 python3 -m benchmarks.host_profile --parts dense --top 45 > $OUT/host_profile.log 2>&1; echo "host_profile rc=$?"
grep -B1 -A13 "^mlp\|^attn\|^moe" $OUT/offload.log | cut -c1-160 | head -60
