# Session 40, call 10: (a) the blockwise casts of a Qwen3 step under other tilings (block_quantize_sweep.py; session
# 39: quantize 3.02 ms a micro-batch blockwise against 1.99 per-tensor). (b) The final code's GPU tests of the
# elementwise kernels (the second stage's rule widened past 16384 columns after call 3) and the CUDA edge cases of
# the dbias / norm ops. ~6 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 240 python3 benchmarks/results/session40/block_quantize_sweep.py > $OUT/block_quantize_sweep.log 2>&1
echo "block quantize sweep rc=$? ($((SECONDS - S)) s)"; cut -c1-160 $OUT/block_quantize_sweep.log | grep -v "^$"
S=$SECONDS
timeout -s INT -k 10 150 python3 -m pytest -p no:cacheprovider -q -m gpu tests/kernels/elementwise > $OUT/gpu_elementwise.log 2>&1
echo "gpu elementwise rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/gpu_elementwise.log | cut -c1-200; tail -1 $OUT/gpu_elementwise.log
LIMIT=100 bash benchmarks/run_gpu.sh edge "BackwardBiasActivation or LayerNorm or RMSNorm" 2>&1 | tail -2
