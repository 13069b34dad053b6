# Session 59: batched cotangents (is_grads_batched, jacobian(vectorize=True)) through every backward, torch.func.vjp's
# vjp_fn on CUDA (dead transform wrappers), the compiled Sequential's backward operator's Batched kernel and
# saved_state.functional(), the routing backward's batched branch: their files on torch 2.11, CPU and GPU variants.
timeout -s INT -k 20 ${LIMIT:-420} python3 -m pytest -p no:cacheprovider -rfE --tb=short -q \
  tests/ops/executor/test_batched_cotangents.py tests/test_torch_nn_behaviour.py tests/test_compile.py \
  tests/moe/test_routing.py tests/moe/test_expert_layer.py tests/ops/executor/test_plain_autograd.py \
  > "$OUT_PART/batched.log" 2>&1
echo "batched rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/batched.log" | cut -c1-250; tail -1 "$OUT_PART/batched.log"
