# Session 25, device call 4: the dense part of the sizes table (every T x H, both activations) with
# graphs captured again at once on a producer's switch.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 560 python3 -m benchmarks.sizes --part dense --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "dense rc=$? ($((SECONDS - S)) s)"; tail -24 $OUT/sizes_dense.log
