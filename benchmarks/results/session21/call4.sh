# Session 21, device call 4 (torch 2.11): the CUDA edge cases of the dense fusions that call 3 did not
# reach (it stopped in ForwardLinearBiasActivation, after GroupedMLP's five passed).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 585 python3 -m pytest -p no:cacheprovider -v -rfE --tb=short --durations=0 tests/fusions/test_edge_cases.py \
  -k "test_edge_case_on_cuda and (ForwardLinear or BackwardLinearBias or BackwardBiasActivation or BackwardActivationLinear or BackwardExtraOutput) and not Quantize and not (ForwardLinearBiasActivation and zero_rows)" > $OUT/edge_cuda.log 2>&1
echo "edge cases rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/edge_cuda.log | cut -c1-200; tail -1 $OUT/edge_cuda.log
grep -E "PASSED|FAILED" $OUT/edge_cuda.log | awk '{print $1}' | sed 's/.*\[//; s/\]//; s/-[a-z_]*$//' | uniq -c | tr '\n' ' '
