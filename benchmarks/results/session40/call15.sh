# Session 40, call 15: each recorded program's CUDA-graph state through 120 steps of two GPU-bound dense cells
# (graph_states.py). ~2 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 300 python3 benchmarks/results/session40/graph_states.py > $OUT/graph_states.log 2>&1
echo "graph states rc=$? ($((SECONDS - S)) s)"; cut -c1-260 $OUT/graph_states.log | grep -v "^$" | tail -60
