# Session 24, device call 10: graphs v2 with the graph-memory registry (inputs found in another graph's
# results are pinned; copied slots that settle there are recaptured pinned). Tests, states, dense H=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/ops/executor/test_graphed.py > $OUT/graphed.log 2>&1
echo "graphed rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/graphed.log | cut -c1-700 | head -20; tail -1 $OUT/graphed.log
timeout 60 python3 benchmarks/results/session24/graph_states.py 2>&1 | grep -E "^(graphed|eager|measuring|trial|\{|enqueue)" | cut -c1-220
FUSEOPS_CUDA_GRAPHS=1 timeout 130 python3 -m benchmarks.sizes --part dense --H 1024 --T 1024 4096 --rounds 2 --reps 10 --out $OUT/dense_g1 > $OUT/dense_g1.log 2>&1
echo "dense graphs=1 rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/dense_g1.log
