# Session 24, device call 8: graphs v2: results handed out over graph memory (no clones; a held result sends the
# next call eager), inputs pinned by address only. Tests, the host profile, then dense H=1024 graphs on / off.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/ops/executor/test_graphed.py > $OUT/graphed.log 2>&1
echo "graphed rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR|E  )" $OUT/graphed.log | cut -c1-700 | head -20; tail -2 $OUT/graphed.log
timeout 100 python3 benchmarks/results/session24/graph_debug.py > $OUT/graph_debug.log 2>&1; tail -8 $OUT/graph_debug.log
timeout 60 python3 benchmarks/results/session24/graph_profile.py > $OUT/profile.txt 2>&1; head -4 $OUT/profile.txt
for g in 1 0; do
  FUSEOPS_CUDA_GRAPHS=$g timeout 130 python3 -m benchmarks.sizes --part dense --H 1024 --T 1024 4096 --rounds 2 --reps 10 --out $OUT/dense_g$g > $OUT/dense_g$g.log 2>&1
  echo "dense graphs=$g rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/dense_g$g.log
done
