# Session 34, call 1 (prepared in session 33): issue 20's closing table, its dense part (every cell: T in
# {1024, 4096, 16384} x H in {1024, 2048, 4096}, GELU and SwiGLU; ~6 min in session 29) and the MoE cells at
# T=16384 (not run since session 29). Session 33's call 5 has the MoE cells at T=1024 and 4096.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 400 python3 -m benchmarks.sizes --part dense --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A40 "^cell" $OUT/sizes_dense.log | cut -c1-250; S=$SECONDS
timeout 170 python3 -m benchmarks.sizes --part moe --T 16384 --rounds 2 --reps 10 --out $OUT/sizes_moe16k > $OUT/sizes_moe16k.log 2>&1
echo "sizes moe 16384 rc=$? ($((SECONDS - S)) s)"; grep -A10 "^cell" $OUT/sizes_moe16k.log | cut -c1-330
