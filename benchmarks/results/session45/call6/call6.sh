# Session 45 call 6: kernel_sums.py again at GELU T=4096 H=4096 with the GPU's idle time between a step's kernels
# (call 5: fuseops' kernels sum to no more than torch's, yet its step is ~0.4 ms longer); then the tests/ops files
# call 5's `ops` part did not reach (it stopped at 74 %, in test_gated.py); pytest directly (run_gpu.sh appends
# files to its part's own selection).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 150 python3 benchmarks/results/session45/kernel_sums.py --cells gelu:4096:4096 > $OUT/kernel_sums.log 2>&1
echo "kernel_sums rc=$? ($((SECONDS - S)) s)"
timeout -s INT -k 20 $((570 - SECONDS)) python3 -m pytest -p no:cacheprovider -rfE --tb=short -v \
  tests/ops/test_gated.py tests/ops/test_grouped_linear.py tests/ops/test_linear.py tests/ops/test_norm.py \
  tests/ops/test_op.py tests/ops/test_quantized.py tests/ops/test_quantized_non_finite.py \
  tests/ops/test_quantized_weight_cache.py tests/ops/test_residual.py tests/ops/test_shape.py > $OUT/ops_rest.log 2>&1
echo "ops rest rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/ops_rest.log | cut -c1-200; tail -1 $OUT/ops_rest.log
grep -v Warn $OUT/kernel_sums.log | grep -E "^==|idle ms|largest gaps" -A9 | grep -v "^--" | head -60
