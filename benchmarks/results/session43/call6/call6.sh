# Session 43, call 6: issue 20's MoE cells at T=16384 (Qwen3, OLMoE, Mixtral; uniform and skewed), with the
# busy-host issue time, on main with branch moe-eager-replay merged.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 570 python3 -m benchmarks.sizes --part moe --T 16384 --out $OUT/sizes_moe_t16384 > $OUT/sizes_moe_t16384.log 2>&1
echo "sizes moe rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_moe_t16384.log | cut -c1-300
