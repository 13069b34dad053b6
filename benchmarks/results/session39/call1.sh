# Session 39, call 1 (prepared in session 38, no device time left then): the blockwise Gluon kernels'
# staggered consumers (pipeline.mma_steps' STAGGER: the second consumer issues a stage's product once the
# first's is done, so each consumer's rescale runs under the other's MMA; written without a GPU, off on the
# dispatch rows). Prediction: the blockwise forward / dgrad at Mixtral 952 -> 1,100-1,250 TFLOP/s (the two
# consumers now issue together and rescale together; offline for sm_90a no spills, no wgmma serialization,
# +48 bytes of shared memory). (a) their GPU tests (bit for bit the kernels without it, several tiles a
# program); (b) both shapes' six GEMMs with and without (fp8_gemm_tiles --recipe "fp8 blockwise"); (c) if
# faster: the layer A/B (fp8_moe, a patched copy with stagger=True as the launchers' default). ~8 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout -s INT 150 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/kernels/hopper/test_blockwise.py \
  tests/kernels/hopper/test_blockwise_wgrad.py 2>&1 | tail -4 | cut -c1-250
echo "tests ($((SECONDS - S)) s)"; S=$SECONDS
for shape in mixtral-8x7b qwen3-30b-a3b; do
  timeout 100 python3 -m benchmarks.fp8_gemm_tiles --shape $shape --recipe "fp8 blockwise" --library-only \
    --out $OUT/stagger_tiles_$shape.json > $OUT/stagger_tiles_$shape.log 2>&1
  echo "tiles $shape rc=$? ($((SECONDS - S)) s)"; grep -A7 "fastest per GEMM" $OUT/stagger_tiles_$shape.log | cut -c1-120; S=$SECONDS
done
rm -rf /tmp/ab && mkdir /tmp/ab && cp -r fuseops benchmarks tests pyproject.toml /tmp/ab/
sed -i 's/stagger: bool = False/stagger: bool = True/' /tmp/ab/fuseops/kernels/hopper/blockwise.py /tmp/ab/fuseops/kernels/hopper/blockwise_wgrad.py
grep -c "stagger: bool = True" /tmp/ab/fuseops/kernels/hopper/blockwise.py /tmp/ab/fuseops/kernels/hopper/blockwise_wgrad.py
for ab in "as_is $PWD" "stagger /tmp/ab"; do
  set -- $ab
  (cd $2 && timeout 120 python3 -m benchmarks.fp8_moe --recipes "fp8 blockwise" --rounds 3 --out $OUT/fp8_moe_$1.json > $OUT/fp8_moe_$1.log 2>&1)
  echo "fp8_moe $1 rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_$1.log | cut -c1-100; S=$SECONDS
done
