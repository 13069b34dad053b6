# Session 40, call 3: the row reductions before / after call 2's second-stage tile (`_SECOND_STAGE`, 64 x 16) and
# the GELU dbias first-stage tile (32 x 128), GPU time in CUDA graphs (reductions_ab.py). Then the GPU tests of
# every kernel that sums partials (elementwise; the gated GEMMs' dprobs) and the CUDA edge cases of the
# dbias / norm ops. ~6 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 200 python3 benchmarks/results/session40/reductions_ab.py > $OUT/reductions_ab.log 2>&1
echo "reductions a/b rc=$? ($((SECONDS - S)) s)"; cat $OUT/reductions_ab.log | cut -c1-150
S=$SECONDS
timeout -s INT -k 10 200 python3 -m pytest -p no:cacheprovider -q -m gpu tests/kernels/elementwise \
  tests/kernels/gemm/test_grouped_gated.py tests/kernels/gemm/test_grouped_scaled_dgrad_gated.py > $OUT/gpu_reductions.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/gpu_reductions.log | cut -c1-200; tail -1 $OUT/gpu_reductions.log
LIMIT=100 bash benchmarks/run_gpu.sh edge "BackwardBiasActivation or LayerNorm or RMSNorm" 2>&1 | tail -3
