# Session 39, call 3 (prepared in session 38): issue 20's Mixtral MoE cells (declared blocked for 1.2x in session
# 36; the table owes every cell), T=1024 / 4096 / 16384, eager and compiled; then benchmarks.autocast at T=1024
# (float32 weights under torch.autocast: the rules' hot-path check, not run in session 38). ~8 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 330 python3 -m benchmarks.sizes --part moe --T 1024 4096 16384 --shapes mixtral --rounds 2 --reps 10 \
  --out $OUT/sizes_moe_mixtral > $OUT/sizes_moe_mixtral.log 2>&1
echo "sizes moe mixtral rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_moe_mixtral.log | cut -c1-250; S=$SECONDS
timeout 150 python3 -m benchmarks.autocast --T 1024 > $OUT/autocast.log 2>&1
echo "autocast rc=$? ($((SECONDS - S)) s)"; tail -12 $OUT/autocast.log | cut -c1-200
