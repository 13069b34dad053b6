# Session 63's activation references (torch's gelu / silu / threshold / sigmoid kernels and their backward, in
# activation_math.py) on torch 2.11, CPU and CUDA: on CUDA they serve an unfused activation and float64.
timeout -s INT -k 20 ${SIDE_LIMIT:-300} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/ops/test_activation.py tests/ops/test_gated.py tests/kernels/elementwise/test_activation.py \
  tests/kernels/elementwise/test_gated_activation.py tests/test_torch_nn_behaviour.py \
  tests/ops/executor/test_second_backward.py > "$OUT_PART/refs_gpu.log" 2>&1
echo "refs_gpu rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/refs_gpu.log" | cut -c1-200; tail -1 "$OUT_PART/refs_gpu.log"
