# Session 61: create_graph=True through fuseops' autograd Functions (second_backward.py) and the batched-cotangent
# compile test under inductor, and test_float32_precision.py's GPU cases (the dense gated one has not run), on CUDA
# and torch 2.11: their CUDA variants have not run.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-300} python3 -m pytest -p no:cacheprovider -q -rfE tests/ops/executor/test_second_backward.py \
  tests/ops/executor/test_batched_cotangents.py tests/test_torch_nn_behaviour.py tests/kernels/gemm/test_float32_precision.py \
  -k "cuda or second or create_graph or double or gpu" \
  > "$OUT_PART/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT_PART/tests.log"
