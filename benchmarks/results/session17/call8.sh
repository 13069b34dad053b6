# Session 17, device call 8: the Gluon wgrad's unchecked descriptors (check mode), and the dense
# sizes table with the dense GEMMs as custom ops under compile (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT 100 env FUSEOPS_CHECK_LAUNCH=1 $q tests/kernels/hopper/test_wgrad.py tests/kernels/gemm/test_dense.py > $OUT/tests_wgrad.log 2>&1
echo "wgrad/dense tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_wgrad.log | cut -c1-220; tail -1 $OUT/tests_wgrad.log
timeout 440 python3 -m benchmarks.sizes --part dense --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1; echo "sizes rc=$?"
tail -20 $OUT/sizes_dense.log | cut -c1-200
