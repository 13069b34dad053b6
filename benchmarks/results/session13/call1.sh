# Session 13, device call 1: the GPU tests fixed after session 12's last call, the host
# profile (issue 20), the offload curve (issue 23), the FP8 MoE cadence table with the
# fusion A/B (issue 24).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout -s INT 120 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu \
  tests/ops/test_quantized_non_finite.py tests/moe/test_routing.py tests/offload/test_planner_cuda.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | cut -c1-200; tail -1 $OUT/tests.log
timeout 90 python3 -m benchmarks.host_profile --top 45 > $OUT/host_profile.log 2>&1; echo "host_profile rc=$?"
timeout 160 python3 -m benchmarks.offload --out $OUT --steps 6 > $OUT/offload.log 2>&1; echo "offload rc=$?"
timeout 180 python3 -m benchmarks.fp8_moe --ab-fusions --rounds 1 --out $OUT/fp8_moe.json > $OUT/fp8_moe.log 2>&1; echo "fp8_moe rc=$?"
grep "====" $OUT/host_profile.log; tail -22 $OUT/offload.log; tail -22 $OUT/fp8_moe.log
