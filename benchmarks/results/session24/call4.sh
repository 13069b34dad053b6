# Session 24, device call 4: why call 3's captures stayed eager (graphed.refusals), on one test and the dense stack.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 100 python3 -m pytest -p no:cacheprovider -q -x -rfE --tb=short tests/ops/executor/test_graphed.py -k "dense_gelu-dtype0-plain or empty or saved_input" > $OUT/graphed.log 2>&1
echo "graphed rc=$?"; grep -E "^(FAILED|ERROR|E  )" $OUT/graphed.log | cut -c1-600 | head -20; tail -2 $OUT/graphed.log
timeout 120 python3 benchmarks/results/session24/graph_debug.py 2>&1 | tail -12
