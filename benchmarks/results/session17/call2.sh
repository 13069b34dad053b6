# Session 17, device call 2: the MoE GPU tests call 1's limit cut, and the dense sizes table
# (issue 20: every dense cell in one run).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT 100 $q tests/moe/test_routing.py::test_gpu_range_checks_capture_in_a_cuda_graph tests/kernels/moe > $OUT/tests_moe2.log 2>&1
echo "moe tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_moe2.log | cut -c1-220; tail -1 $OUT/tests_moe2.log
timeout 470 python3 -m benchmarks.sizes --part dense --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1; echo "sizes rc=$?"
tail -22 $OUT/sizes_dense.log | cut -c1-200
