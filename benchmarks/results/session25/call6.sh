# Session 25, device call 6: the MoE part of the sizes table (same code as call 4's dense part), then the
# compile GPU tests and the integrations (the graph path changed under them).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 260 python3 -m benchmarks.sizes --part moe --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "moe rc=$? ($((SECONDS - S)) s)"; S=$SECONDS
timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_compile.py --tb=line 2>&1 | tail -3
echo "compile tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/integrations --tb=line 2>&1 | tail -3
echo "integrations ($((SECONDS - S)) s)"
tail -20 $OUT/sizes_moe.log
