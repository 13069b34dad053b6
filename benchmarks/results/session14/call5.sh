# Session 14, device call 5: call 4's dense sizes table again (make_graphed_callables had
# replaced the torch model's forward for the first row count; now a copy is graphed).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 330 python3 -m benchmarks.sizes --part dense --acts gelu --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes rc=$?"; tail -12 $OUT/sizes_dense.log | cut -c1-150
