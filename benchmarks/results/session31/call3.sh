# Session 31, device call 3: the host-path cuts (routing_graphs.call hashing its key once, busy() stopping
# at the first live result, the gate's key as plain values) A/B against the tree before them, on one
# machine in alternation (expert_layer and the composition, eager, Qwen3 and OLMoE at T=1024); the
# compiled composition's host split (cProfile); the MoE sizes at T=1024; the GPU tests of what changed.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
B=/tmp/base_tree; mkdir -p $B && cp -r fuseops benchmarks $B/
F=benchmarks/results/session31/base_files
cp $F/routing_graphs.py $F/expert_layer.py $F/expert_layer_steps.py $B/fuseops/moe/ && cp $F/graphed.py $B/fuseops/ops/executor/
for round in 1 2; do
  PYTHONPATH=$B timeout 60 python3 benchmarks/results/session31/enqueue_ab.py before >> $OUT/enqueue_ab.log 2>&1
  timeout 60 python3 benchmarks/results/session31/enqueue_ab.py after >> $OUT/enqueue_ab.log 2>&1
done
echo "enqueue A/B ($((SECONDS - S)) s)"; grep -E "T=|Error" $OUT/enqueue_ab.log | cut -c1-300; S=$SECONDS
timeout 100 python3 benchmarks/results/session31/compiled_host_split.py qwen3 1024 > $OUT/compiled_host_split.log 2>&1
echo "compiled host split rc=$? ($((SECONDS - S)) s)"; grep -E "^== " $OUT/compiled_host_split.log | cut -c1-300; S=$SECONDS
timeout 200 python3 -m benchmarks.sizes --part moe --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_moe.log | cut -c1-330; S=$SECONDS
timeout -s INT -k 10 130 python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/moe/test_routing_graphs.py \
  tests/moe/test_expert_layer.py tests/ops/executor/test_graphed.py > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/gpu_tests.log | cut -c1-250 | head -12; tail -1 $OUT/gpu_tests.log
