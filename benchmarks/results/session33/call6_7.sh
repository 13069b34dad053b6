# Session 33, calls 6 and 7 (run inline, written down here): call 5's Mixtral FP8 table at 8 micro-batches
# was ~4 ms slower than call 2's for both the layer and the composition; the same table again (fp8 current
# only, with the SM clock before and after), then Qwen3's fp8 current table again with three rounds.
export PYTHONPATH=. PYTHONUNBUFFERED=1
# call 6
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
timeout 150 python3 -m benchmarks.fp8_moe --shapes mixtral-8x7b --recipes "fp8 current" --rounds 2 --out $OUT/fp8_moe_mixtral_again.json > $OUT/fp8_moe_mixtral_again.log 2>&1
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
# call 7
timeout 150 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_qwen3_again.json > $OUT/fp8_moe_qwen3_again.log 2>&1
