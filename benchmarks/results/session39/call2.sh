# Session 39, call 2 (prepared in session 38): issue 20's table, the cells not run since session 35. (a) The dense
# stack, every cell in one run (session 35: eager >= 1.0x the faster torch on all 18, >= 1.2x on the host-bound
# four; compiled >= torch.compile on 13). (b) The MoE cells at T=16384 for Qwen3 and OLMoE (session 38's call 5 ran
# T=1024 / 4096 on an H200). ~9.5 min; run call 3 for Mixtral.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 400 python3 -m benchmarks.sizes --part dense --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A20 "^cell" $OUT/sizes_dense.log | cut -c1-250; S=$SECONDS
timeout 160 python3 -m benchmarks.sizes --part moe --T 16384 --shapes qwen3 olmoe --rounds 2 --reps 10 \
  --out $OUT/sizes_moe_16k > $OUT/sizes_moe_16k.log 2>&1
echo "sizes moe 16k rc=$? ($((SECONDS - S)) s)"; grep -A6 "^cell" $OUT/sizes_moe_16k.log | cut -c1-250
