# Session 29, device call 7: the compiled Sequential's GPU tests after the layout check accepts a
# repeated result as a tensor of its own over the same memory (a replayed CUDA graph hands out each
# result so: call 6's grouped failure), the MoE compiled tests, then the sizes at T=1024 (dense, MoE)
# with the compiled columns against torch.compile.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_compiled_sequential.py \
  tests/test_compile.py tests/moe/test_expert_layer_ops.py -m gpu > $OUT/compile_tests.log 2>&1
echo "compile tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/compile_tests.log | cut -c1-300 | head -14; tail -1 $OUT/compile_tests.log; S=$SECONDS
timeout 170 python3 -m benchmarks.sizes --part dense --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_dense.log | cut -c1-220; S=$SECONDS
timeout 190 python3 -m benchmarks.sizes --part moe --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_moe.log | cut -c1-330
