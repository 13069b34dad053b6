# Session 25, device call 1: the graph tests (new churn rule, refactored tests), settling with the
# churn rule, steady state (session 24's script), the graph states + profile, autocast dense with
# graphs on and off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/executor -x 2>&1 | tail -4
echo "executor tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 80 python3 benchmarks/results/session25/settle.py 2>&1 | grep -v Warn
echo "settle ($((SECONDS - S)) s)"; S=$SECONDS
timeout 80 python3 benchmarks/results/session24/steady.py 2>&1 | grep -v Warn | tail -5
echo "steady ($((SECONDS - S)) s)"; S=$SECONDS
timeout 60 python3 benchmarks/results/session24/graph_states.py > $OUT/graph_states.txt 2>&1
echo "graph_states rc=$? ($((SECONDS - S)) s)"; S=$SECONDS
for g in 1 0; do
  FUSEOPS_CUDA_GRAPHS=$g timeout 120 python3 -m benchmarks.autocast --models dense --out $OUT/autocast_graphs$g.json > $OUT/autocast_graphs$g.log 2>&1
  echo "autocast graphs=$g rc=$? ($((SECONDS - S)) s)"; tail -4 $OUT/autocast_graphs$g.log; S=$SECONDS
done
