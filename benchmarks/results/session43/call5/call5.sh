# Session 43, call 5: issue 20's MoE cells at T=1024 / 4096 (Qwen3, OLMoE, Mixtral; uniform and skewed), with the
# busy-host issue time, on main with branch moe-eager-replay merged.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 570 python3 -m benchmarks.sizes --part moe --T 1024 4096 --out $OUT/sizes_moe_t1024_4096 > $OUT/sizes_moe_t1024_4096.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A14 "^cell" $OUT/sizes_moe_t1024_4096.log | cut -c1-300
