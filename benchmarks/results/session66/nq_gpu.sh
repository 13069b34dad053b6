# Session 66 call 9: the norm + quantize forward's register caps on CUDA through the producer-quantize fusion's
# tests, and the one CUDA edge case of its subject that call 8 did not reach.
timeout -s INT -k 20 ${NQ_LIMIT:-200} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/fusions/test_producer_quantize_linear.py tests/kernels/elementwise/test_norm_quantize.py \
  > "$OUT_PART/nq_gpu.log" 2>&1
echo "nq_gpu rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/nq_gpu.log" | cut -c1-200; tail -1 "$OUT_PART/nq_gpu.log"
timeout -s INT -k 20 ${EDGE_LIMIT:-100} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/fusions/test_edge_cases.py -k "test_edge_case_on_cuda and ForwardNormQuantizeLinear and non_contiguous" \
  > "$OUT_PART/edge_nq.log" 2>&1
echo "edge rc=$?"; tail -1 "$OUT_PART/edge_nq.log"
