# Session 31, device call 4: call 3's A/B again with the tree before the cuts importable (its copy
# lacked pyproject.toml, which fuseops reads its version from when not installed): expert_layer and
# the composition, eager, Qwen3 and OLMoE at T=1024, three rounds in alternation on one machine; the
# GPU tests of graphed.py; the dense sizes at T=1024 (the graphed programs' busy check changed).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
B=/tmp/base_tree; mkdir -p $B && cp -r fuseops benchmarks pyproject.toml $B/
F=benchmarks/results/session31/base_files
cp $F/routing_graphs.py $F/expert_layer.py $F/expert_layer_steps.py $B/fuseops/moe/ && cp $F/graphed.py $B/fuseops/ops/executor/
for round in 1 2 3; do
  PYTHONPATH=$B timeout 60 python3 benchmarks/results/session31/enqueue_ab.py before >> $OUT/enqueue_ab.log 2>&1
  timeout 60 python3 benchmarks/results/session31/enqueue_ab.py after >> $OUT/enqueue_ab.log 2>&1
done
echo "enqueue A/B ($((SECONDS - S)) s)"; grep -E "T=|Error" $OUT/enqueue_ab.log | cut -c1-300; S=$SECONDS
timeout -s INT -k 10 160 python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/ops/executor/test_graphed.py > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/gpu_tests.log | cut -c1-250 | head -12; tail -1 $OUT/gpu_tests.log; S=$SECONDS
timeout 180 python3 -m benchmarks.sizes --part dense --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_dense.log | cut -c1-260
