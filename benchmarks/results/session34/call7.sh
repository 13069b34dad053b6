# Session 34, call 7: the per-tensor cast with the column-wise copy at 128x128 in groups of 8 row tiles
# (call 3's sweep: 0.768 / 0.292 / 0.769 / 0.580 ms against the 128x64 default's 0.965 / 0.366 / 0.962 /
# 0.733). (a) moe_quantize with the new default (the gathered casts of the quantized layer too). (b) The
# quantized layer at Qwen3 against bf16 (issue 24: FP8 current >= 1.3x at 8 micro-batches, 1.15x at 1).
# (c) The quantize kernel's GPU tests of per-tensor scaling (the new tiling on real shapes).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 60 python3 -m benchmarks.moe_quantize > $OUT/moe_quantize.log 2>&1
echo "moe_quantize rc=$? ($((SECONDS - S)) s)"; grep -E "copy |gathered|group_r=8, maxnreg=0\): |block_c=64, num_warps=4, staged=False, group_r=0" $OUT/moe_quantize.log | cut -c1-150; S=$SECONDS
timeout 130 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 2 --out $OUT/fp8_moe_qwen3.json > $OUT/fp8_moe_qwen3.log 2>&1
echo "fp8_moe qwen3 rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_qwen3.log | cut -c1-120; S=$SECONDS
timeout -s INT -k 20 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/quantization/test_quantize.py -m gpu -k TENSOR > $OUT/quantize_gpu.log 2>&1
echo "quantize TENSOR GPU tests rc=$? ($((SECONDS - S)) s)"; tail -3 $OUT/quantize_gpu.log
