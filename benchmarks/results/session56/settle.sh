# The GPU offload test that failed in session 56 (run 4), with the warm-up's final form (graph_settle_steps), and the
# CPU test of it on the device's torch 2.11 (~2 min).
timeout 300 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/offload/test_planner_cuda.py \
  "tests/ops/executor/test_graphed_states.py::test_the_benchmarks_warm_up_ends_once_the_graph_states_have_settled" \
  > "$OUT_PART/settle.log" 2>&1
echo "settle rc=$?"; tail -3 "$OUT_PART/settle.log" | cut -c1-200
