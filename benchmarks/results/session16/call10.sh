# Session 16, device call 10: the MoE layer's host time op by op (issue 20; never run before),
# the dense block's again with the backward timer fixed, and the MoE sizes at T=4096 / 16384
# (OLMoE) after the range-check move.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 80 python3 -m benchmarks.host_trace --part moe --top 30 > $OUT/host_trace_moe.log 2>&1; echo "host_trace moe rc=$?"
timeout 60 python3 -m benchmarks.host_trace --top 12 > $OUT/host_trace_dense.log 2>&1; echo "host_trace dense rc=$?"
timeout 110 python3 -m benchmarks.sizes --part moe --shapes olmoe --T 4096 16384 --reps 5 --out $OUT/sizes_moe_olmoe > $OUT/sizes_moe_olmoe.log 2>&1
echo "sizes rc=$?"
grep -v USDT $OUT/host_trace_moe.log | grep -v "_warn_once\|UserWarning" | head -40 | cut -c1-110
grep "host us per step" $OUT/host_trace_dense.log
tail -5 $OUT/sizes_moe_olmoe.log | cut -c1-150
