# Session 24, device call 17 (the last): dense H=1024 cells with 30 warm-up steps a variant (sizes.py now
# measures steady state: fuseops decides its CUDA graphs over its first ~10-30 calls) and GPU_BOUND 2.0.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 250 python3 -m benchmarks.sizes --part dense --H 1024 --rounds 2 --reps 10 --out $OUT/sizes_h1024 > $OUT/sizes_h1024.log 2>&1
echo "dense rc=$? ($((SECONDS - S)) s)"; tail -9 $OUT/sizes_h1024.log
