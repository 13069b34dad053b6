# Session 35, call 11: the compiled Sequential's trimmed wrapper (the last Sequential tried first,
# one alias set a call) on the SwiGLU cells where compiled fuseops trailed torch.compile in call 1
# (H=1024 / 2048 at T=1024 / 4096: 0.88-1.0x there), its tests on torch 2.11 (CPU and GPU),
# then issue 24's blockwise rows at both shapes (not measured since session 33).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part dense --acts swiglu --H 1024 2048 --T 1024 4096 --out $OUT/sizes_swiglu > $OUT/sizes_swiglu.log 2>&1
echo "sizes swiglu rc=$? ($((SECONDS - S)) s)"; grep -A5 "^cell" $OUT/sizes_swiglu.log | cut -c1-120; S=$SECONDS
timeout -s INT 170 python3 -m pytest -p no:cacheprovider -q -rfE tests/test_compiled_sequential.py tests/test_compile.py > $OUT/compile_tests.log 2>&1
echo "compile tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/compile_tests.log | cut -c1-200; tail -1 $OUT/compile_tests.log; S=$SECONDS
for shape in qwen3-30b-a3b mixtral-8x7b; do
  timeout 90 python3 -m benchmarks.fp8_moe --shapes $shape --recipes "fp8 blockwise" --rounds 2 --out $OUT/fp8_blk_$shape.json > $OUT/fp8_blk_$shape.log 2>&1
  echo "fp8_moe blockwise $shape rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_blk_$shape.log | cut -c1-120; S=$SECONDS
done
