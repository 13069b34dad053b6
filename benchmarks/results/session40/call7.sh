# Session 40, call 7: issue 20's dense table, every cell in one run, after this session's reduction tiles (the
# norm backward's second stage, the GELU dbias tile, the bias gradient's second stage). Session 39's call 2: eager
# >= 1.0x on 16 of 18 (ties 0.998x at H=4096 T=4096), compiled >= torch.compile on 11 of 18. ~7 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 540 python3 -m benchmarks.sizes --part dense --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A20 "^cell" $OUT/sizes_dense.log | cut -c1-250
