# Session 43, call 8: the dense cells where compiled fuseops lost to torch.compile in call 4 (H=4096, and H=2048
# T=16384), again with sizes.py's rounds in alternating order (every other round reversed: a fixed order handed the
# later variants a hotter, power-capped GPU).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 330 python3 -m benchmarks.sizes --part dense --H 4096 --out $OUT/sizes_dense_h4096 > $OUT/sizes_dense_h4096.log 2>&1
echo "sizes dense H=4096 rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_dense_h4096.log | cut -c1-250
S=$SECONDS
timeout $((580 - SECONDS)) python3 -m benchmarks.sizes --part dense --H 2048 --T 16384 --out $OUT/sizes_dense_h2048_t16384 > $OUT/sizes_dense_h2048_t16384.log 2>&1
echo "sizes dense H=2048 T=16384 rc=$? ($((SECONDS - S)) s)"; grep -A4 "^cell" $OUT/sizes_dense_h2048_t16384.log | cut -c1-250
