# Session 38, call 6 (H100, as issue 24 states its targets): (a) call 4's failure after the grouped wgrad's
# main_grad fix (call 5's selection ran past its limit before reaching it), the kernel's GPU tests;
# (b) issue 24's table in one run on the H100: bf16, FP8 current and blockwise, both shapes, 1 and 8
# micro-batches (call 5 on an H200: Mixtral's 8-micro-batch FP8 rows 22.7-23.9 ms against call 3's
# 16.9, slower than one micro-batch: run it again here). ~6 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
S=$SECONDS
timeout -s INT 120 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/kernels/gemm/test_grouped_wgrad.py \
  tests/moe/test_expert_layer.py -k "main_grad or prior or gathered" 2>&1 | tail -4 | cut -c1-250
echo "wgrad tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 300 python3 -m benchmarks.fp8_moe --recipes "fp8 current" "fp8 blockwise" --rounds 3 --out $OUT/fp8_moe_h100.json > $OUT/fp8_moe_h100.log 2>&1
echo "fp8_moe rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_h100.log | cut -c1-100
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
