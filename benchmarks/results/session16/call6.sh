# Session 16, device call 6: the executor host-path cuts (issue 20: is_compiling once a call,
# role tuples, dispatch memo by id, Linear.save's weight, one-slab bias reductions): their GPU
# tests (compile on torch 2.11, torch.nn behaviour, ops, fusions, elementwise), then the host
# trace and host costs against calls 1 and 3.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 400 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/test_compile.py \
  tests/test_torch_nn_behaviour.py tests/test_sequential.py tests/ops tests/fusions tests/kernels/elementwise/test_activation.py \
  tests/kernels/elementwise/test_bias_grad.py tests/kernels/test_dispatch.py -k "not properties" > $OUT/tests_exec.log 2>&1
echo "exec tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_exec.log | cut -c1-220; tail -1 $OUT/tests_exec.log
timeout 70 python3 -m benchmarks.host_trace --top 20 > $OUT/host_trace.log 2>&1; echo "host_trace rc=$?"
timeout 45 python3 -m benchmarks.host_costs > $OUT/host_costs.log 2>&1; echo "host_costs rc=$?"
grep -v USDT $OUT/host_trace.log | head -8 | cut -c1-110
tail -9 $OUT/host_costs.log | cut -c1-140
