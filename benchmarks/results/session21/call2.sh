# Session 21, device call 2 (torch 2.11): the rest of run_gpu.sh's models part: tests/offload whole
# (call 1 stopped in test_quantized.py), then the CUDA edge cases that session 20's call 8 did not
# reach (from GroupedLinear-non_contiguous on), the unquantized subjects first.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short"
timeout -s INT -k 10 240 $q tests/offload > $OUT/offload_tests.log 2>&1
echo "tests/offload rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/offload_tests.log | cut -c1-200; tail -1 $OUT/offload_tests.log
timeout -s INT -k 10 $((585 - (SECONDS - S))) python3 -m pytest -p no:cacheprovider -v -rfE --tb=short tests/fusions/test_edge_cases.py \
  -k "test_edge_case_on_cuda and not Quantize and not Quantized and not GatedAmax and not (GroupedLinear and not non_contiguous) and not AddExtraInput and not Bias- and not ClampedSwiGLU and not GELU and not GeGLU" > $OUT/edge_cuda.log 2>&1
echo "edge cases rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/edge_cuda.log | cut -c1-200; tail -1 $OUT/edge_cuda.log
grep -E "PASSED|FAILED" $OUT/edge_cuda.log | tail -1 | cut -c1-120
