# Session 17, device call 3: the MoE sizes table (issue 20: every MoE cell in one run).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 570 python3 -m benchmarks.sizes --part moe --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1; echo "sizes rc=$?"
tail -22 $OUT/sizes_moe.log | cut -c1-200
