# Session 17, device call 4: the CUDA edge-case suite's fused ops (the executor trims of
# session 16 touched every op's save path; these slices had not run on the GPU since).
export PYTHONPATH=. PYTHONUNBUFFERED=1
q="python3 -m pytest -p no:cacheprovider -v -rfE --tb=short -m gpu tests/fusions/test_edge_cases.py"
timeout -s INT -k 10 270 $q -k "cuda and Backward" > $OUT/edge_backward.log 2>&1
echo "edge backward rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/edge_backward.log | cut -c1-220; tail -1 $OUT/edge_backward.log
timeout -s INT -k 10 270 $q -k "cuda and (ForwardActivationQuantize or ForwardNormQuantize or ForwardQuantizeLinear or ForwardLinearSeparate or ForwardQuantizedGroupedMLP)" > $OUT/edge_forward.log 2>&1
echo "edge forward rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/edge_forward.log | cut -c1-220; tail -1 $OUT/edge_forward.log
