# Session 27, device call 2: where the MoE layer's host time goes now that the routing is graphed,
# the MoE sizes at T=1024, and the 16-layer OLMoE stack's step and reserved memory at T=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 100 python3 -m benchmarks.host_trace --part moe --top 30 > $OUT/host_trace_moe.log 2>&1
echo "host_trace moe rc=$? ($((SECONDS - S)) s)"; S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part moe --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_moe1024 > $OUT/sizes_moe1024.log 2>&1
echo "sizes moe T=1024 rc=$? ($((SECONDS - S)) s)"; S=$SECONDS
timeout 200 python3 benchmarks/results/session26/moe_stack.py --T 1024 > $OUT/moe_stack.log 2>&1
echo "moe_stack rc=$? ($((SECONDS - S)) s)"
grep -v "Warn\|warn" $OUT/host_trace_moe.log | head -36 | cut -c1-120
tail -8 $OUT/sizes_moe1024.log | cut -c1-220
grep -v "Warn\|warn" $OUT/moe_stack.log | tail -5 | cut -c1-250
