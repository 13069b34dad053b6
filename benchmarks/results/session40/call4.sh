# Session 40, call 4: call 3 again after the second stage widens past 16384 columns (call 3: 0.60-0.76x at the
# gated backward's tall dprobs partials in 16 columns), then the GPU tests of the gated GEMMs that sum them. ~4 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 200 python3 benchmarks/results/session40/reductions_ab.py > $OUT/reductions_ab.log 2>&1
echo "reductions a/b rc=$? ($((SECONDS - S)) s)"; cat $OUT/reductions_ab.log | cut -c1-150
S=$SECONDS
timeout -s INT -k 10 200 python3 -m pytest -p no:cacheprovider -q -m gpu tests/kernels/elementwise/test_bias_grad.py \
  tests/kernels/gemm/test_grouped_gated.py tests/kernels/gemm/test_grouped_scaled_dgrad_gated.py > $OUT/gpu_reductions.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/gpu_reductions.log | cut -c1-200; tail -1 $OUT/gpu_reductions.log
