# Session 39, call 17: the RMSNorm / LayerNorm backward on its own tiles (32 values a thread, two programs a
# multiprocessor; norm_sweep in call 16): the norm GPU tests, the library's backward at the six swept shapes
# (call 16, old tiles: 106.3 / 69.3 / 25.9 / 26.8 / 44.0 / 93.3 us), issue 20's dense cells where fuseops tied
# torch (H=1024 T=4096 / 16384, H=4096 T=4096).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/kernels/elementwise/test_norm.py \
  tests/ops/test_norm.py 2>&1 | tail -3 | cut -c1-200
echo "tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 60 python3 benchmarks/results/session39/norm_sweep.py --library-only 2>&1 | grep library | cut -c1-150
echo "norm ($((SECONDS - S)) s)"; S=$SECONDS
timeout 110 python3 -m benchmarks.sizes --part dense --H 1024 --T 4096 16384 --out $OUT/sizes_dense_h1024 > $OUT/sizes_dense_h1024.log 2>&1
echo "sizes H=1024 rc=$? ($((SECONDS - S)) s)"; grep -A5 "^cell" $OUT/sizes_dense_h1024.log | cut -c1-130; S=$SECONDS
timeout 110 python3 -m benchmarks.sizes --part dense --H 4096 --T 4096 --out $OUT/sizes_dense_h4096 > $OUT/sizes_dense_h4096.log 2>&1
echo "sizes H=4096 rc=$? ($((SECONDS - S)) s)"; grep -A3 "^cell" $OUT/sizes_dense_h4096.log | cut -c1-130
