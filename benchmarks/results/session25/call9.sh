# Session 25, device call 9: GPU_BOUND 4.0 (call 8): the dense part of the sizes table, every cell, and the MoE
# part at T=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 420 python3 -m benchmarks.sizes --part dense --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "dense rc=$? ($((SECONDS - S)) s)"; S=$SECONDS
timeout 120 python3 -m benchmarks.sizes --part moe --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_moe1024 > $OUT/sizes_moe1024.log 2>&1
echo "moe rc=$? ($((SECONDS - S)) s)"
tail -20 $OUT/sizes_dense.log; tail -8 $OUT/sizes_moe1024.log
