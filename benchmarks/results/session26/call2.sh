# Session 26, device call 2: a capture hands out its graph's results and pins inputs lying in other
# graphs' results (deep stacks settled with one capture a program on the CPU stand-in): the graph
# tests, deep stacks against torch eager, settling, a user's loop, the host-bound dense cells.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/executor/test_graphed.py --tb=short 2>&1 | grep -v "^  warn\|Warning\|^    return\|^$" | tail -25
echo "graph tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 120 python3 benchmarks/results/session26/deep_settle.py 4 12 24 2>&1 | grep -v "Warn\|gc.get_objects"
echo "deep_settle ($((SECONDS - S)) s)"; S=$SECONDS
timeout 70 python3 benchmarks/results/session25/settle.py 2>&1 | grep -v Warn
echo "settle ($((SECONDS - S)) s)"; S=$SECONDS
timeout 70 python3 benchmarks/results/session25/user_loop.py 2>&1 | grep -v Warn
echo "user_loop ($((SECONDS - S)) s)"; S=$SECONDS
timeout 200 python3 -m benchmarks.sizes --part dense --T 1024 4096 --H 1024 --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; tail -12 $OUT/sizes_dense.log
