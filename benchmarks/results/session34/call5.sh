# Session 34, call 5. (a) What fuseops' CUDA graphs hold per token count (call 4: 6.1 / 8.1 / 18.6 GiB
# allocated after SwiGLU H=4096 at T=1024 / 4096 / 16384, one model), each step's peak against torch
# eager's. (b) The dense H=1024 cells with the graph states' decisions per cell (call 1: GELU T=4096
# at 1.06x where it is host-bound and the target 1.2x). (c) Two CUDA edge cases owed since session 31.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 120 python3 benchmarks/results/session34/graph_memory.py --H 4096 > $OUT/graph_memory.log 2>&1
echo "graph memory rc=$? ($((SECONDS - S)) s)"; grep -v Warning $OUT/graph_memory.log | grep -E "^(T=|end|swiglu|Traceback|[A-Za-z]*Error)" | cut -c1-400; S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part dense --H 1024 --T 1024 4096 --out $OUT/sizes_dense_h1024 > $OUT/sizes_dense_h1024.log 2>&1
echo "sizes dense H=1024 rc=$? ($((SECONDS - S)) s)"; grep -A6 "^cell" $OUT/sizes_dense_h1024.log | cut -c1-250
python3 -c "import json; [print(r['act'], r['T'], r['H'], 'graphs', r['graph_counts'], 'in timed fuseops steps', r['fuseops_graph_counts']['graph_replays'], 'allocated', round(r['cuda_allocated_mb'])) for r in json.load(open('$OUT/sizes_dense_h1024.json'))['rows']]"; S=$SECONDS
timeout -s INT -k 20 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/fusions/test_edge_cases.py \
  -k "test_edge_case_on_cuda and ForwardQuantizedGroupedMLP and (one_row or non_finite)" > $OUT/edge.log 2>&1
echo "edge rc=$? ($((SECONDS - S)) s)"; tail -3 $OUT/edge.log
