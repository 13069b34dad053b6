# Session 34, call 6: the idle graphs' budget (graphed.MEMORY_FRACTION, new). (a) graph_memory.py at SwiGLU
# H=4096 with the default budget (5 %) and with 1 % (the T=1024 graphs, 1.37 GB, then past it: freed at
# T=4096's captures). (b) The graph states' GPU tests, the new one included. (c) The dense H=1024 cells
# (the hot path gained a counter in GraphedProgram.run): against call 5.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for f in "" 0.01; do
  timeout 100 python3 benchmarks/results/session34/graph_memory.py --H 4096 ${f:+--fraction $f} > $OUT/graph_memory$f.log 2>&1
  echo "graph memory ${f:-default} rc=$? ($((SECONDS - S)) s)"; grep -E "^(T=|end|swiglu|Traceback|[A-Za-z]*Error)" $OUT/graph_memory$f.log | cut -c1-420; S=$SECONDS
done
timeout -s INT -k 20 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/ops/executor/test_graphed.py tests/moe/test_routing_graphs.py -m gpu > $OUT/graphed_gpu.log 2>&1
echo "graphed GPU tests rc=$? ($((SECONDS - S)) s)"; tail -3 $OUT/graphed_gpu.log; S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part dense --H 1024 --T 1024 4096 --out $OUT/sizes_dense_h1024 > $OUT/sizes_dense_h1024.log 2>&1
echo "sizes dense H=1024 rc=$? ($((SECONDS - S)) s)"; grep -A6 "^cell" $OUT/sizes_dense_h1024.log | cut -c1-250
python3 -c "import json; [print(r['act'], r['T'], r['H'], 'graphs', r['graph_counts'], 'allocated', round(r['cuda_allocated_mb']), 'graphs hold', round(r['graphs_held_mb'])) for r in json.load(open('$OUT/sizes_dense_h1024.json'))['rows']]"
