# Session 28, device call 9: the dense sizes at the host-bound token counts (T=1024, 4096; every
# width, both activations: unchanged code but graphed.py's re-measurement since session 26's table),
# then quantized edge cases (not run since session 23) as the call's time allows.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 330 python3 -m benchmarks.sizes --part dense --T 1024 4096 --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A13 "^cell" $OUT/sizes_dense.log | cut -c1-200; S=$SECONDS
LIMIT=$((560 - SECONDS)) bash benchmarks/run_gpu.sh edge "BackwardGatedAmaxLinear and (zero_rows or non_finite or dtype_max)"; cp /tmp/fuseops-gpu/edge.log $OUT/ 2>/dev/null
echo "edge ($((SECONDS - S)) s)"
