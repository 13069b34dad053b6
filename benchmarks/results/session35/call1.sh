# Session 35, call 1 (prepared in session 34): issue 20's dense table with every cell in one run (session 34's
# run ran out of memory at SwiGLU T=4096 H=4096: torch's make_graphed_callables copies, now collected per cell),
# each cell's graph decisions, what stays allocated and what fuseops' graphs hold. Also tells whether the dense
# enqueue at T=16384 / H=4096 (fuseops 3.98-5.54 ms against torch's 3.67-4.74 in session 34, where at T<=4096
# H<=2048 it is 1.25-2.2 against 2.4-3.6) was memory pressure (cached blocks freed: cudaFree synchronises) or
# the host path. Then the CUDA-graph tests (run_gpu.sh graphs, 97 s in session 34).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 420 python3 -m benchmarks.sizes --part dense --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A20 "^cell" $OUT/sizes_dense.log | cut -c1-250
python3 -c "import json; [print(r['act'], r['T'], r['H'], 'allocated', round(r['cuda_allocated_mb']), 'graphs hold', round(r['graphs_held_mb']), 'cudaFree in enqueue f/t', r['fuseops_enqueue_device_frees'], r['torch_enqueue_device_frees'], r['graph_counts']) for r in json.load(open('$OUT/sizes_dense.json'))['rows']]"; S=$SECONDS
LIMIT=140 OUT=$OUT bash benchmarks/run_gpu.sh graphs | tail -3
