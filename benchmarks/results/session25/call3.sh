# Session 25, device call 3: graphs captured again at once when a pinned input moves into another
# graph's results (and copied slots fed from graphs: captured again, not measured again); the
# graph tests, settling, steady state, graph states.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/executor/test_graphed.py --tb=short 2>&1 | grep -v "^  warn\|Warning\|^    return\|^$" | tail -25
echo "graph tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 80 python3 benchmarks/results/session25/settle.py 2>&1 | grep -v Warn
echo "settle ($((SECONDS - S)) s)"; S=$SECONDS
timeout 80 python3 benchmarks/results/session24/steady.py 2>&1 | grep -v Warn | tail -5
echo "steady ($((SECONDS - S)) s)"; S=$SECONDS
timeout 60 python3 benchmarks/results/session24/graph_states.py 2>&1 | head -12
