# Session 29, device call 12: the last quantized edge cases of BackwardGatedAmaxLinear (one row, non-contiguous).
mkdir -p $OUT && OUT=$OUT LIMIT=200 bash benchmarks/run_gpu.sh edge "BackwardGatedAmaxLinear and (one_row or non_contiguous)"; grep -E "PASSED|FAILED|ERROR" $OUT/edge.log | sed "s/.*test_edge_case_on_cuda//" | cut -c1-120
