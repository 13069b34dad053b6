# Session 24, device call 11: graphs v2, the keep rule now asks the host time to shrink and the GPU span to grow
# by under 10 % (call 10 freed every backward graph). Tests, states, dense H=1024 graphs on and off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/ops/executor/test_graphed.py > $OUT/graphed.log 2>&1
echo "graphed rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/graphed.log | cut -c1-700 | head -20; tail -1 $OUT/graphed.log
timeout 60 python3 benchmarks/results/session24/graph_states.py 2>&1 | grep -E "^(graphed|eager|measuring|trial|\{|enqueue)" | cut -c1-220
FUSEOPS_CUDA_GRAPHS=1 timeout 130 python3 -m benchmarks.sizes --part dense --H 1024 --T 1024 4096 --rounds 2 --reps 10 --out $OUT/dense_g1 > $OUT/dense_g1.log 2>&1
echo "dense graphs=1 rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/dense_g1.log
FUSEOPS_CUDA_GRAPHS=0 timeout 130 python3 -m benchmarks.sizes --part dense --H 1024 --T 1024 4096 --rounds 2 --reps 10 --out $OUT/dense_g0 > $OUT/dense_g0.log 2>&1
echo "dense graphs=0 rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/dense_g0.log
