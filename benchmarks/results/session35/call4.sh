# Session 35, call 4: the gathered per-tensor cast (the quantized layer's x and dy) at 128x128 in
# program order (call 2's sweep: 0.567 ms against the default 128x64's 0.681). moe_quantize's
# "default tiling" row now reports it; the layer at Qwen3 against call 2's 12.56 / 13.91 ms; the
# GPU tests of quantize with picked rows and the quantized layer (run_gpu.sh fp8layer).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 100 python3 -m benchmarks.moe_quantize > $OUT/moe_quantize.log 2>&1
echo "moe_quantize rc=$? ($((SECONDS - S)) s)"; grep -E "default tiling" $OUT/moe_quantize.log | cut -c1-170; S=$SECONDS
timeout 80 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_qwen3.json > $OUT/fp8_moe_qwen3.log 2>&1
echo "fp8_moe qwen3 rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_qwen3.log | cut -c1-120; S=$SECONDS
LIMIT=200 OUT=$OUT bash benchmarks/run_gpu.sh fp8layer | tail -3
