# Session 24, device call 3: graphed.py again, pinned slots now need the same tensor object (call 2 pinned
# activations at a reused address, then dropped them: 19 drops). Tests, then dense H=1024 graphs on and off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/ops/executor/test_graphed.py > $OUT/graphed.log 2>&1
echo "graphed rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/graphed.log | head -20; tail -2 $OUT/graphed.log
for g in 1 0; do
  FUSEOPS_CUDA_GRAPHS=$g timeout 130 python3 -m benchmarks.sizes --part dense --H 1024 --T 1024 4096 --rounds 2 --reps 10 --out $OUT/dense_g$g > $OUT/dense_g$g.log 2>&1
  echo "dense graphs=$g rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/dense_g$g.log
done
