# Session 62's GELU(tanh) references (torch's gelu / gelu_backward, activation_math.py) on torch 2.11, CPU and CUDA:
# the activation ops and kernels, autocast, torch.nn behaviour (each file whole: its CPU cases run on torch 2.11 too).
timeout -s INT -k 20 ${SIDE_LIMIT:-200} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -x \
  tests/ops/test_activation.py tests/kernels/elementwise/test_activation.py tests/ops/executor/test_autocast.py \
  tests/test_torch_nn_behaviour.py > "$OUT_PART/gelu_ref.log" 2>&1
echo "gelu_ref rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/gelu_ref.log" | cut -c1-200; tail -1 "$OUT_PART/gelu_ref.log"
