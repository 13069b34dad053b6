# Session 25, device call 10: the GPU suite's kernels part from where session 23's call 6 stopped
# (tests/kernels/gemm/test_grouped_wgrad.py on; the files before it passed there).
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=dev
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout -s INT -k 20 540 python3 -m pytest -p no:cacheprovider -rfE --tb=short -v -m gpu \
  tests/kernels/gemm/test_grouped_wgrad.py tests/kernels/gemm/test_tma_checks.py tests/kernels/gemm/test_traced.py \
  tests/kernels/gemm/test_wgrad_walk.py tests/kernels/hopper tests/kernels/moe tests/kernels/quantization/test_amax.py \
  tests/kernels/quantization/test_epilogue.py tests/kernels/quantization/test_formats.py tests/kernels/test_*.py \
  > $OUT/kernels_rest.log 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/kernels_rest.log | cut -c1-200; tail -1 $OUT/kernels_rest.log
