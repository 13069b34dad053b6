# Session 41, call 6: FUSEOPS_CUDA_GRAPHS=all (GPU-bound programs graphed too): (a) the gpu-marked graph tests under
# it; (b) gpu_bound_graphs.py at the MoE cells where the expert layer's programs are GPU-bound (expert_layer,
# Qwen3 / OLMoE T=16384, Qwen3 T=4096): host time a step, the step, memory, today's rule against GPU_BOUND = inf.
# ~5 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
FUSEOPS_CUDA_GRAPHS=all LIMIT=150 bash benchmarks/run_gpu.sh graphs 2>&1 | tail -3
S=$SECONDS
timeout 300 python3 benchmarks/results/session41/gpu_bound_graphs.py --cells moe:qwen3:16384 moe:olmoe:16384 \
  moe:qwen3:4096 > $OUT/gpu_bound_graphs_moe.log 2>&1
echo "rc=$? ($((SECONDS - S)) s)"; grep -v -i "warn\|^ *return" $OUT/gpu_bound_graphs_moe.log | cut -c1-330
