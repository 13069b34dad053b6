# Session 21, device call 5 (torch 2.11): the last dense-fusion CUDA edge cases (call 4 stopped in
# BackwardActivationLinear), then the quantized subjects' CUDA edge cases as far as the call goes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 585 python3 -m pytest -p no:cacheprovider -v -rfE --tb=short tests/fusions/test_edge_cases.py \
  -k "test_edge_case_on_cuda and ((BackwardActivationLinear and not zero_rows and not one_row) or BackwardExtraOutput or Quantize or GatedAmax)" > $OUT/edge_cuda.log 2>&1
echo "edge cases rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/edge_cuda.log | cut -c1-200; tail -1 $OUT/edge_cuda.log
grep -E "PASSED|FAILED" $OUT/edge_cuda.log | awk '{print $1}' | sed 's/.*\[//; s/\]//; s/-[a-z_]*$//' | uniq -c | tr '\n' ' '
