# Session 18, device call 14: the final code: quantized fusion GPU tests after the quantize
# kernel change (issue 24), and the offload benchmark with 5 interleaved rounds (issue 23;
# the planner as in call 1, the backward in offload/backward.py).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
timeout -s INT -k 10 210 $q tests/fusions/test_forward_quantized_grouped_mlp.py tests/fusions/test_backward_quantized_gated_mlp.py tests/fusions/test_backward_gated_amax_linear.py > $OUT/tests_fusions.log 2>&1
echo "quantized fusion tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_fusions.log | cut -c1-220; tail -1 $OUT/tests_fusions.log
timeout 330 python3 -m benchmarks.offload --out $OUT --steps 6 --rounds 5 > $OUT/offload.log 2>&1; echo "offload rc=$?"
grep -E "^(mlp|attn|moe):|auto|none |all " $OUT/offload.log | grep -v "auto profile" | cut -c1-300
