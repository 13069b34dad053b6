# Session 36, call 5: issue 24 at Qwen3. (a) The quantized grouped GEMMs' tiles at the Qwen3 shape,
# GEMM by GEMM (call 4: FC2's forward runs at ~920 TFLOP/s against ~1200 for the other GEMMs; the
# library's tiles were swept at the Mixtral shape). (b) fp8_moe with sustained timing beside its
# do_bench default (call 3/4's profiles, back to back: 1.34x at eight micro-batches; fp8_moe's do_bench
# 1.26x in call 2).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 330 python3 -m benchmarks.fp8_gemm_tiles --out $OUT/fp8_gemm_tiles_qwen3.json > $OUT/fp8_gemm_tiles_qwen3.log 2>&1
echo "tiles rc=$? ($((SECONDS - S)) s)"; grep -v "Warning\|_warn_once" $OUT/fp8_gemm_tiles_qwen3.log | tail -60 | cut -c1-200; S=$SECONDS
timeout 150 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 2 --timing sustained --warmup-s 2 --steps 5 --out $OUT/fp8_moe_qwen3_sustained.json > $OUT/fp8_moe_qwen3_sustained.log 2>&1
echo "fp8_moe sustained rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_qwen3_sustained.log | cut -c1-120
