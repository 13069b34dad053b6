# Session 44, call 3: (a) a compiled step's timeline against eager's at GELU T=4096 H=1024 (call 2: 2.72 against
# 1.78 ms, every program a CUDA graph in both); (b) the `kernels` GPU part's files that call 1 did not reach.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 150 python3 benchmarks/results/session44/compiled_timeline.py --cells gelu:4096:1024 > $OUT/timeline.log 2>&1
echo "timeline rc=$? ($((SECONDS - S)) s)"
S=$SECONDS
timeout -s INT -k 20 $((570 - SECONDS)) python3 -m pytest -p no:cacheprovider -rfE --tb=short -v -m gpu \
  tests/kernels/hopper/test_blockwise.py tests/kernels/hopper/test_blockwise_wgrad.py \
  tests/kernels/hopper/test_tensor_scaled.py tests/kernels/hopper/test_tensor_scaled_wgrad.py \
  tests/kernels/moe/test_permute.py tests/kernels/quantization/test_formats.py tests/kernels/test_dense_dispatch.py \
  tests/kernels/test_dispatch.py tests/kernels/test_launch.py > $OUT/kernels_rest.log 2>&1
echo "kernels rest rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/kernels_rest.log | cut -c1-200; tail -1 $OUT/kernels_rest.log
grep -v -i warn $OUT/timeline.log | head -120
