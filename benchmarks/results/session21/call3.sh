# Session 21, device call 3 (torch 2.11): the LayerNorm(1) fix (norm kernels' row means correctly
# rounded): the norm kernel GPU tests and the LayerNorm CUDA edge cases that failed in call 2; then
# the CUDA edge cases of the dense fusions, then GroupedMLP's (call 2 stopped in GroupedMLP-one_row).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short"
timeout -s INT -k 10 200 $q tests/kernels/elementwise/test_norm.py tests/kernels/elementwise/test_norm_quantize.py \
  tests/fusions/test_edge_cases.py -k "test_norm or test_gpu or (test_edge_case_on_cuda and (LayerNorm or RMSNorm))" > $OUT/norm.log 2>&1
echo "norm rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/norm.log | cut -c1-200; tail -1 $OUT/norm.log
timeout -s INT -k 10 $((585 - (SECONDS - S))) python3 -m pytest -p no:cacheprovider -v -rfE --tb=short tests/fusions/test_edge_cases.py \
  -k "test_edge_case_on_cuda and (ForwardLinear or BackwardLinearBias or BackwardBiasActivation or BackwardActivationLinear or BackwardExtraOutput or GroupedMLP) and not Quantize" > $OUT/edge_cuda.log 2>&1
echo "edge cases rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/edge_cuda.log | cut -c1-200; tail -1 $OUT/edge_cuda.log
grep -E "PASSED|FAILED" $OUT/edge_cuda.log | awk '{print $1}' | sed 's/.*\[//; s/\]//; s/-[a-z_]*$//' | uniq -c | tr '\n' ' '
