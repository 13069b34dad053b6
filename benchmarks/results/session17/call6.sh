# Session 17, device call 6: the compiled MoE layer with the routing custom ops (issue 20: the
# MoE sizes table again), and the auto plan's H100 profile for the mlp and moe stacks (issue 23).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 250 python3 -m benchmarks.sizes --part moe --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1; echo "sizes rc=$?"
timeout 250 python3 -m benchmarks.offload --out $OUT --steps 6 --stacks mlp,moe > $OUT/offload.log 2>&1; echo "offload rc=$?"
tail -20 $OUT/sizes_moe.log | cut -c1-200
grep -E "auto|^mlp|^moe" $OUT/offload.log | cut -c1-900
