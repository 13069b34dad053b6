# Session 28, device call 8: the MoE sizes at T=4096 and 16384 with the compiled expert_layer column
# (two custom operators replaying its graph states; eager where GPU-bound).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 560 python3 -m benchmarks.sizes --part moe --T 4096 16384 --rounds 2 --reps 10 --out $OUT/sizes_moe4096_16384 > $OUT/sizes_moe.log 2>&1
echo "sizes moe T=4096 16384 rc=$? ($((SECONDS - S)) s)"
grep -A14 "^cell" $OUT/sizes_moe.log | cut -c1-330
