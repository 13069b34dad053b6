# Session 59: batched cotangents (is_grads_batched, jacobian(vectorize=True)) through every backward, torch.func.vjp's
# vjp_fn on CUDA (dead transform wrappers), the compiled Sequential's backward operator's Batched kernel and
# saved_state.functional(), the routing backward's batched branch, activation checkpointing and parametrized weights
# (test_torch_nn_behaviour): their files on torch 2.11, CPU and GPU variants. Run 6 ran a first version (79 % in 420 s,
# 0 failed: every file but the last, test_plain_autograd, which run 4's `graphs` part had run).
timeout -s INT -k 20 ${LIMIT:-420} python3 -m pytest -p no:cacheprovider -rfE --tb=short -q \
  tests/test_torch_nn_behaviour.py tests/ops/executor/test_batched_cotangents.py tests/test_compile.py \
  tests/test_compiled_sequential.py tests/moe/test_routing.py tests/moe/test_expert_layer.py \
  > "$OUT_PART/batched.log" 2>&1
echo "batched rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/batched.log" | cut -c1-250; tail -1 "$OUT_PART/batched.log"
