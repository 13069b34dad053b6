# Session 40, call 13: the MoE cells at T=1024 / 4096 (Qwen3, OLMoE; uniform and skewed) after this session's
# second-stage tile, which the gated backward's dprobs sum goes through (2.1-2.5x faster alone at its tall shapes,
# call 4). Session 39's call 13 ran the same cells. ~5 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 540 python3 -m benchmarks.sizes --part moe --T 1024 4096 --shapes qwen3 olmoe --rounds 2 --reps 10 \
  --out $OUT/sizes_moe_small > $OUT/sizes_moe_small.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A9 "^cell" $OUT/sizes_moe_small.log | cut -c1-250
