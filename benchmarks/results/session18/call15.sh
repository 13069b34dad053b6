# Session 18, device call 15: the quantized fusion GPU tests call 14's limit cut (the last three
# of test_backward_quantized_gated_mlp.py and test_backward_gated_amax_linear.py).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT -k 10 300 $q "tests/fusions/test_backward_quantized_gated_mlp.py::test_no_host_sync_on_cuda" tests/fusions/test_backward_gated_amax_linear.py > $OUT/tests_fusions.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_fusions.log | cut -c1-220; tail -1 $OUT/tests_fusions.log
