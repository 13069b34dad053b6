# Session 26, device call 6: programs writing into a pinned input are graphed (the grouped MLP's
# backward writes dz over z): the graph tests; the MoE layer at T=1024 under GPU_BOUND 4 / 8 / inf.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/executor/test_graphed.py --tb=short > $OUT/graphed.log 2>&1
echo "graph tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/graphed.log | cut -c1-250 | head -20; tail -1 $OUT/graphed.log; S=$SECONDS
for bound in 4 8 inf; do
  GPU_BOUND=$bound timeout 120 python3 benchmarks/results/session26/moe_small.py 1024 2>&1 | grep -v "Warn\|gc.get_objects\|return Variable\|^  warn\|measuring, captures 0"
  echo "moe_small GPU_BOUND=$bound ($((SECONDS - S)) s)"; S=$SECONDS
done
