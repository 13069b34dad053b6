# Session 41, call 3: what graphing the GPU-bound dense programs would save in host time and cost in memory and step
# time (gpu_bound_graphs.py), five GPU-bound cells, today's rule against GPU_BOUND = inf. ~3 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 400 python3 benchmarks/results/session41/gpu_bound_graphs.py > $OUT/gpu_bound_graphs.log 2>&1
echo "rc=$? ($((SECONDS - S)) s)"; grep -v -i "warn\|^ *return" $OUT/gpu_bound_graphs.log | cut -c1-330
