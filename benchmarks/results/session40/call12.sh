# Session 40, call 12: the blockwise forward / dgrad loading each step's scales two steps ahead (as the wgrad
# does), against loading them in the step (call 6's Nsight Compute: 6.7 % of the forward's warp samples at the FMUL
# waiting on them). A/B in one call: fp8_gemm_tiles --recipe "fp8 blockwise" --library-only at both shapes with
# the change (the tree as sent) and without (call12_prefetch.patch reversed on the device's copy), interleaved;
# then the Hopper blockwise GPU tests on the change. ~8 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
P=benchmarks/results/session40/call12_prefetch.patch
run() {  # $1 label, $2 shape
  S=$SECONDS
  timeout 110 python3 -m benchmarks.fp8_gemm_tiles --shape $2 --recipe "fp8 blockwise" --library-only --rounds 3 \
    > $OUT/tiles_$1_$2.log 2>&1
  echo "== $1 $2 rc=$? ($((SECONDS - S)) s)"; grep -E "^fc" $OUT/tiles_$1_$2.log | cut -c1-60
}
run ahead qwen3-30b-a3b
git apply -R $P && run instep qwen3-30b-a3b
run instep mixtral-8x7b
git apply $P && run ahead mixtral-8x7b
git diff --stat | tail -1
S=$SECONDS
timeout -s INT -k 10 120 python3 -m pytest -p no:cacheprovider -q -m gpu tests/kernels/hopper/test_blockwise.py > $OUT/gpu_blockwise.log 2>&1
echo "gpu blockwise rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/gpu_blockwise.log | cut -c1-200; tail -1 $OUT/gpu_blockwise.log
