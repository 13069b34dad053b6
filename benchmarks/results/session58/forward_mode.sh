# Session 58: forward-mode / higher-order derivatives (ops/executor/plain_autograd.py), the MoE helpers under
# torch.func, the float64 activation backward, the grouped references without out= under torch.func: their tests on
# torch 2.11 (CPU and GPU variants), then the `top` part (tests/test_*.py: compile, compiled Sequential) for
# run_prepared's change. ~9 min.
timeout -s INT -k 20 200 python3 -m pytest -p no:cacheprovider -rfE --tb=short -q \
  tests/ops/executor/test_plain_autograd.py tests/kernels/elementwise/test_activation.py \
  tests/kernels/elementwise/test_gated_activation.py tests/moe/test_routing.py tests/kernels/gemm/test_grouped_wgrad.py \
  > "$OUT_PART/forward_mode.log" 2>&1
echo "forward_mode rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/forward_mode.log" | cut -c1-250; tail -1 "$OUT_PART/forward_mode.log"
timeout -s INT -k 20 330 python3 -m pytest -p no:cacheprovider -rfE --tb=short -q tests/test_*.py \
  > "$OUT_PART/top.log" 2>&1
echo "top rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/top.log" | cut -c1-250; tail -1 "$OUT_PART/top.log"
