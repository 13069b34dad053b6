# Session 26, device call 1: the graph changes made after session 25's last call (moved activation ->
# copied and captured again at once; kept results -> copies; capture() split out): the executor's GPU
# tests, settling, deep stacks, a user's loop, the graphs' memory, autocast dense.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/executor --tb=short 2>&1 | grep -v "^  warn\|Warning\|^    return\|^$" | tail -25
echo "executor tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 70 python3 benchmarks/results/session25/settle.py 2>&1 | grep -v Warn
echo "settle ($((SECONDS - S)) s)"; S=$SECONDS
timeout 120 python3 benchmarks/results/session26/deep_settle.py 4 12 24 2>&1 | grep -v Warn
echo "deep_settle ($((SECONDS - S)) s)"; S=$SECONDS
timeout 70 python3 benchmarks/results/session25/user_loop.py 2>&1 | grep -v Warn
echo "user_loop ($((SECONDS - S)) s)"; S=$SECONDS
timeout 60 python3 benchmarks/results/session25/graph_memory.py 2>&1 | grep -v Warn
echo "graph_memory ($((SECONDS - S)) s)"; S=$SECONDS
timeout 100 python3 -m benchmarks.autocast --models dense --out $OUT/autocast.json > $OUT/autocast.log 2>&1
echo "autocast rc=$? ($((SECONDS - S)) s)"; tail -4 $OUT/autocast.log
