# Session 60: the gated GEMM's shape-aware dispatch (cuBLAS + the gated kernel under 2 / 3 waves of y's tiles), on the
# H100: its GPU tests, the CUDA property test of the fusions it serves, then sizes.py's SwiGLU cells whose fc1 moves
# to cuBLAS in training (H=1024 / 2048, T=1024: 1.27 / 2.61 waves) on this tree and on a copy whose rule is "always
# fused" (the RULE entries set to None with sed), this tree first.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -p no:cacheprovider -q -rfE tests/kernels/test_dense_dispatch.py > "$OUT_PART/dispatch_tests.log" 2>&1
echo "dispatch tests rc=$?"; tail -1 "$OUT_PART/dispatch_tests.log"
rm -rf /tmp/fused && mkdir /tmp/fused && cp -r fuseops benchmarks pyproject.toml /tmp/fused/
sed -i -e 's/Epilogue.GATED: 2.0,/Epilogue.GATED: None,/' -e 's/Epilogue.GATED_SAVED: 3.0,/Epilogue.GATED_SAVED: None,/' \
  /tmp/fused/fuseops/kernels/dense_dispatch.py
grep -c "GATED.*: None," /tmp/fused/fuseops/kernels/dense_dispatch.py
for side in table fused table_again; do
  dir=.; [[ $side == fused ]] && dir=/tmp/fused
  ( cd "$dir" && timeout 150 python3 -m benchmarks.sizes --part dense --acts swiglu --H 1024 2048 --T 1024 --rounds 2 \
      --out "$OUT_PART/swiglu_$side" > "$OUT_PART/swiglu_$side.log" 2>&1; echo "$side rc=$?" )
  grep -hE "^swiglu " "$OUT_PART/swiglu_$side.log" | cut -c1-160
done
LIMIT=${PROPS_LIMIT:-240} OUT=$OUT_PART bash benchmarks/run_gpu.sh props "ForwardLinearBiasActivation" | tail -3
