# Session 29, device call 10: do the MoE step's graph states keep capturing in steady state at Qwen3
# T=32768 (call 1's lead)? Then the MoE sizes at T=16384 with the compiled columns.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 benchmarks/results/session29/captures_over_time.py 2>&1 | grep -v Warn | tail -16
echo "captures ($((SECONDS - S)) s)"; S=$SECONDS
timeout 300 python3 -m benchmarks.sizes --part moe --T 16384 --rounds 1 --reps 5 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_moe.log | cut -c1-330
