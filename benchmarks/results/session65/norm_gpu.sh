# Session 65's norm change (rows above 2^40 normalized first; never run on a GPU): the norm kernel tests on CUDA and
# torch 2.11 (CPU cases too), then the forward A/B against the module before it (norm_ab.py).
timeout -s INT -k 20 ${SIDE_LIMIT:-300} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/kernels/elementwise/test_norm.py tests/kernels/elementwise/test_norm_quantize.py tests/ops/test_norm.py \
  > "$OUT_PART/norm_gpu.log" 2>&1
echo "norm_gpu rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/norm_gpu.log" | cut -c1-200; tail -1 "$OUT_PART/norm_gpu.log"
root=$PWD; rm -rf /tmp/abn && mkdir -p /tmp/abn && cp -r fuseops /tmp/abn/ && (cd /tmp/abn && patch -p1 -s < "$root/benchmarks/results/session65/norm_revert.patch")
timeout ${AB_LIMIT:-150} python3 benchmarks/results/session65/norm_ab.py 2>&1 | grep -v Warn | tee "$OUT_PART/norm_ab.log"
