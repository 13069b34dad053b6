# Session 38, call 5: (a) the grouped wgrad's main_grad fix (the finished sum added to the buffer) on the
# GPU: its kernel tests, the expert layer's main_grad tests (call 3's failure) and the hopper wgrad's;
# (b) issue 24's table in one run: bf16, FP8 current and FP8 blockwise at both shapes, 1 and 8
# micro-batches; (c) the rules' owed hot-path check: the MoE sizes cells at T=1024 / 4096, eager and
# compiled (Qwen3, OLMoE). ~9.5 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT 100 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/kernels/gemm/test_grouped_wgrad.py \
  tests/moe/test_expert_layer.py tests/kernels/hopper/test_wgrad.py -k "main_grad or wgrad or prior" 2>&1 | tail -4 | cut -c1-250
echo "wgrad tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 240 python3 -m benchmarks.fp8_moe --recipes "fp8 current" "fp8 blockwise" --rounds 3 --out $OUT/fp8_moe_all.json > $OUT/fp8_moe_all.log 2>&1
echo "fp8_moe rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_all.log | cut -c1-100; S=$SECONDS
timeout 200 python3 -m benchmarks.sizes --part moe --T 1024 4096 --shapes qwen3 olmoe --rounds 2 --reps 10 \
  --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A10 "^cell" $OUT/sizes_moe.log | cut -c1-250
