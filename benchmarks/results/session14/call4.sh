# Session 14, device call 4 (the last the budget allows): compile and CUDA graphs on the GPU
# after the role-table fix (issue 20), the MoE layer's table without Liger (issue 25; Liger's
# first call did not finish in 190-240 s in calls 2 and 3), the dense sizes table, GELU (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -s INT 100 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/test_compile.py \
  > $OUT/compile_tests.log 2>&1
echo "compile tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/compile_tests.log | cut -c1-200; tail -1 $OUT/compile_tests.log
mkdir -p $OUT/moe
timeout 110 python3 -m benchmarks.moe_layer --shapes qwen3-30b-a3b mixtral-8x7b --impls fuseops "fuseops lean" torch \
  --rounds 1 --rep 50 --no-graph --out-dir $OUT/moe > $OUT/moe_layer.log 2>&1; echo "moe_layer rc=$?"
timeout 330 python3 -m benchmarks.sizes --part dense --acts gelu --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes rc=$?"
grep -A12 "^MoE expert layer" $OUT/moe_layer.log | cut -c1-150
tail -12 $OUT/sizes_dense.log | cut -c1-150
