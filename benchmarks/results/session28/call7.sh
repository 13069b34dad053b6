# Session 28, device call 7: expert_layer under torch.compile as two custom operators replaying its
# graph states (expert_layer_steps.py); our other custom operators through recorded programs
# (op_programs.py). The MoE tests (GPU, and the new CPU ones on torch 2.11), then the MoE sizes at
# T=1024 with the compiled expert_layer column.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 260 python3 -m pytest -q -p no:cacheprovider --tb=short tests/moe/test_routing_graphs.py tests/moe/test_expert_layer_ops.py \
  tests/moe/test_expert_layer.py tests/ops/executor/test_op_programs.py -m "gpu or not gpu" -k "gpu or compiled or opcheck or operator" > $OUT/moe_tests.log 2>&1
echo "moe tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/moe_tests.log | cut -c1-250 | head -12; tail -1 $OUT/moe_tests.log; S=$SECONDS
timeout 200 python3 -m benchmarks.sizes --part moe --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_moe1024 > $OUT/sizes_moe1024.log 2>&1
echo "sizes moe T=1024 rc=$? ($((SECONDS - S)) s)"
grep -A8 "^cell" $OUT/sizes_moe1024.log | cut -c1-330
