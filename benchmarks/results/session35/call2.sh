# Session 35, call 2 (prepared in session 34): issue 24. (a) moe_quantize: the gathered cast (the quantized
# layer's x and dy) over every tile candidate, rows in permute's order (session 34: 128x128 in groups of 8 was
# slower than 128x64 for it with random picks, 0.755 against 0.679 ms, and the layer with it slower); the
# layer at Qwen3 (fp8_moe; session 34's end skipped the range checks of the routing's own offsets and tokens,
# ~25 small kernels a step: against call 8's 12.50-12.58 ms at eight micro-batches, 13.62-13.70 at one). (b) The layer at Mixtral with session 34's grouped
# tiling for h and dz (8 groups; not measured there). (c) MoE sizes at T=1024 / 4096 (issue 20's table).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 120 python3 -m benchmarks.moe_quantize > $OUT/moe_quantize.log 2>&1
echo "moe_quantize rc=$? ($((SECONDS - S)) s)"; grep -E "^FC|gathered" $OUT/moe_quantize.log | cut -c1-170; S=$SECONDS
timeout 80 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_qwen3.json > $OUT/fp8_moe_qwen3.log 2>&1
echo "fp8_moe qwen3 rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_qwen3.log | cut -c1-120; S=$SECONDS
timeout 110 python3 -m benchmarks.fp8_moe --shapes mixtral-8x7b --recipes "fp8 current" --rounds 2 --out $OUT/fp8_moe_mixtral.json > $OUT/fp8_moe_mixtral.log 2>&1
echo "fp8_moe mixtral rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_mixtral.log | cut -c1-120; S=$SECONDS
timeout 200 python3 -m benchmarks.sizes --part moe --T 1024 4096 --rounds 2 --reps 10 --out $OUT/sizes_moe > $OUT/sizes_moe.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A14 "^cell" $OUT/sizes_moe.log | cut -c1-330
