# Session 40, call 5 (prepared in session 39): the hot-path check owed after session 39's norm backward tiles
# (measured then only at H=1024 T=4096 / 16384 and H=4096 T=4096): the dense cells at T=1024 (every width, both
# activations; host-bound there) and float32 weights under autocast (`benchmarks.autocast`, whose dense model has
# RMSNorm). Run after any elementwise tile adopted in call 1, so both are checked at once. ~4 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 240 python3 -m benchmarks.sizes --part dense --T 1024 --out $OUT/sizes_dense_t1024 > $OUT/sizes_dense_t1024.log 2>&1
echo "sizes dense T=1024 rc=$? ($((SECONDS - S)) s)"; grep -A7 "^cell" $OUT/sizes_dense_t1024.log | cut -c1-130; S=$SECONDS
timeout 150 python3 -m benchmarks.autocast --T 1024 > $OUT/autocast.log 2>&1
echo "autocast rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/autocast.log | cut -c1-200
