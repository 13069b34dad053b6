# Session 24, device call 2: CUDA-graph replay of recorded programs (graphed.py), first GPU run:
# its tests, the executor tests, then the dense host-bound cells and MoE T=1024 with graphs on and off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -x -rfE --tb=short tests/ops/executor/test_graphed.py > $OUT/graphed.log 2>&1
echo "graphed rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/graphed.log | head -20; tail -2 $OUT/graphed.log
for g in 1 0; do
  FUSEOPS_CUDA_GRAPHS=$g timeout 130 python3 -m benchmarks.sizes --part dense --H 1024 --T 1024 4096 --rounds 2 --reps 10 --out $OUT/dense_g$g > $OUT/dense_g$g.log 2>&1
  echo "dense graphs=$g rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/dense_g$g.log
done
FUSEOPS_CUDA_GRAPHS=1 timeout 100 python3 -m benchmarks.sizes --part moe --T 1024 --shapes qwen3 olmoe --rounds 2 --reps 10 --out $OUT/moe_g1 > $OUT/moe_g1.log 2>&1
echo "moe graphs=1 rc=$? ($((SECONDS - S)) s)"; tail -7 $OUT/moe_g1.log
