# Session 17, device call 1: the MoE range-check mode read once (issue 20; GPU moe tests), the
# FP8 current cast given its amax and the FP8 layer table at both shapes and cadences, with
# the fusion A/B at Qwen3 (issue 24), the MoE host trace (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout -s INT 120 $q tests/moe tests/kernels/moe > $OUT/tests_moe.log 2>&1
echo "moe tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_moe.log | cut -c1-220; tail -1 $OUT/tests_moe.log
timeout 120 python3 -m benchmarks.quantize --quantize-only --out $OUT/quantize.json > $OUT/quantize.log 2>&1; echo "quantize rc=$?"
timeout 120 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b mixtral-8x7b --recipes "fp8 current" "fp8 blockwise" --rounds 2 \
  --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1; echo "fp8_moe rc=$?"
timeout 120 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" "fp8 blockwise" --rounds 2 --ab-fusions \
  --out $OUT/fp8_moe_ab.json > $OUT/fp8_moe_ab.log 2>&1; echo "fp8_moe ab rc=$?"
timeout 60 python3 -m benchmarks.host_trace --part moe > $OUT/host_trace_moe.log 2>&1; echo "host_trace rc=$?"
grep -E "micro-batch|^[a-z].*\{" $OUT/fp8_moe.log $OUT/fp8_moe_ab.log | cut -c1-150
grep -E "copy |amax|fp8_current" $OUT/quantize.log | grep -v "^{" | cut -c1-120
tail -30 $OUT/host_trace_moe.log | cut -c1-150
