# Session 29, device call 8: the sizes at T=4096 (dense, MoE) with the compiled columns: the
# Sequentials under torch.compile as two custom operators each (fuseops/compiled_sequential.py).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 290 python3 -m benchmarks.sizes --part dense --T 4096 --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_dense.log | cut -c1-220; S=$SECONDS
timeout 270 python3 -m benchmarks.sizes --part moe --T 4096 --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_moe.log | cut -c1-330
