# Session 41, call 5: call 3 again with the memory read after empty_cache (gpu_bound_graphs.py: graphing the
# GPU-bound dense programs, five GPU-bound cells, today's rule against GPU_BOUND = inf). ~2 min; then issue 20's MoE cells at T=16384 (Qwen3, OLMoE; not run in session 40). ~6 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 400 python3 benchmarks/results/session41/gpu_bound_graphs.py > $OUT/gpu_bound_graphs.log 2>&1
echo "rc=$? ($((SECONDS - S)) s)"; grep -v -i "warn\|^ *return" $OUT/gpu_bound_graphs.log | cut -c1-330
S=$SECONDS
timeout 300 python3 -m benchmarks.sizes --part moe --T 16384 --shapes qwen3 olmoe --rounds 2 --reps 10 \
  --out $OUT/sizes_moe_t16384 > $OUT/sizes_moe_t16384.log 2>&1
echo "sizes moe T=16384 rc=$? ($((SECONDS - S)) s)"; grep -A6 "^cell" $OUT/sizes_moe_t16384.log | cut -c1-250
