# Session 16, device call 3: where the dense block's host time goes op by op (torch.profiler,
# issue 20), and the rest of the kernel suite in check mode (hopper blockwise, after session 15's
# cached Gluon shared layouts).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 90 python3 -m benchmarks.host_trace --top 30 > $OUT/host_trace.log 2>&1; echo "host_trace rc=$?"
timeout -s INT 400 env FUSEOPS_CHECK_LAUNCH=1 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu \
  tests/kernels/hopper/test_blockwise.py tests/kernels/hopper/test_blockwise_wgrad.py > $OUT/tests_blockwise.log 2>&1
echo "blockwise tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_blockwise.log | cut -c1-220; tail -1 $OUT/tests_blockwise.log
grep -v USDT $OUT/host_trace.log | cut -c1-110
