# Session 58: forward-mode / higher-order derivatives (ops/executor/plain_autograd.py), the MoE helpers under
# torch.func, the float64 activation backward, the grouped references without out= under torch.func, the adjoint tests
# (the Triton kernels' backward against forward mode: 33 patterns x 3 examples on CUDA, kernel compiles on a fresh
# machine), create_graph with one gradient: their tests on torch 2.11 (CPU and GPU variants). Run 7 ran a first version
# of this part (then `top`, 262 passed). ~6 min.
timeout -s INT -k 20 420 python3 -m pytest -p no:cacheprovider -rfE --tb=short -q \
  tests/ops/executor/test_plain_autograd.py tests/test_torch_nn_behaviour.py tests/kernels/elementwise/test_activation.py \
  tests/kernels/elementwise/test_gated_activation.py tests/moe/test_routing.py tests/kernels/gemm/test_grouped_wgrad.py \
  > "$OUT_PART/forward_mode.log" 2>&1
echo "forward_mode rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/forward_mode.log" | cut -c1-250; tail -1 "$OUT_PART/forward_mode.log"
