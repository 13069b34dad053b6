# Session 19, device call 11: the quantize offsets test rewritten (sync-debug "error"), and the
# quantized fusion GPU tests call 10's limit cut (backward_gated_amax_linear).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu"
S=$SECONDS
timeout -s INT -k 10 120 $q tests/quant/test_quantize.py -k offsets_that_do_not_fit > $OUT/tests_offsets.log 2>&1
echo "offsets test rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E " $OUT/tests_offsets.log | cut -c1-220 | head; tail -1 $OUT/tests_offsets.log
timeout -s INT -k 10 300 $q tests/fusions/test_backward_gated_amax_linear.py > $OUT/tests_amax.log 2>&1
echo "gated amax fusion gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests_amax.log | cut -c1-220; tail -1 $OUT/tests_amax.log
