# Session 15, device call 7: the kernel suite in check mode (every repeated launch checked
# against Triton's key), after session 14-15's host-path changes (fast launch default, launch
# prep, call cache, dispatch).
export LIMIT=540 FUSEOPS_CHECK_LAUNCH=1
bash benchmarks/run_gpu.sh kernels
grep -cE " PASSED" $OUT/kernels.log; grep -E " (FAILED|ERROR)" $OUT/kernels.log | head -20 | cut -c1-200
