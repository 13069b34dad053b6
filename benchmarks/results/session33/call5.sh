# Session 33, call 5. Call 4's sizes run crashed (illegal memory access) in the compiled MoE composition at
# T=4096 after T=1024: one compiled Sequential's Prepared run serves every size of a dynamic trace, and the
# replay key had strides but no shapes, so T=1024's recorded program replayed at T=4096. The key now has
# the shapes. The compiled-Sequential tests on the GPU (the new dynamic-trace one runs the kernels there),
# the MoE sizes table again, then Mixtral's FP8 table after call 3's cast change.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_compiled_sequential.py > $OUT/compiled_sequential_tests.log 2>&1
echo "compiled Sequential tests rc=$? ($((SECONDS - S)) s)"; tail -2 $OUT/compiled_sequential_tests.log; S=$SECONDS
timeout 250 python3 -m benchmarks.sizes --part moe --T 1024 4096 --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A14 "^cell" $OUT/sizes_moe.log | cut -c1-330; S=$SECONDS
timeout 120 python3 -m benchmarks.fp8_moe --shapes mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe_mixtral.json > $OUT/fp8_moe_mixtral.log 2>&1
echo "fp8_moe mixtral rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_mixtral.log | cut -c1-120
