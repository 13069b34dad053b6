# Session 67: the `kernels` part's files that session 67's call 4 did not reach (it stopped in
# test_grouped_gated.py after 300 s, 193 passed), then the CUDA edge case owed since session 66.
files=$(find tests/kernels -name "test_*.py" | sort | grep -v hopper | grep -v quantization/test_quantize.py \
  | awk '$0 >= "tests/kernels/gemm/test_grouped_gated.py"')
timeout -s INT -k 20 ${KLIMIT:-320} python3 -m pytest -p no:cacheprovider -rfE --tb=short -v -m gpu $files \
  > "$OUT_PART/kernels_rest.log" 2>&1
echo "kernels_rest rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/kernels_rest.log" | cut -c1-200; tail -1 "$OUT_PART/kernels_rest.log"
timeout -s INT -k 20 ${ELIMIT:-200} python3 -m pytest -p no:cacheprovider -rfE --tb=short -v \
  tests/fusions/test_edge_cases.py -k "test_edge_case_on_cuda and ForwardNormQuantizeLinear and non_contiguous" \
  > "$OUT_PART/edge_nql.log" 2>&1
echo "edge_nql rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/edge_nql.log" | cut -c1-200; tail -1 "$OUT_PART/edge_nql.log"
