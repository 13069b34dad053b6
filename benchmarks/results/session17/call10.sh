# Session 17, device call 10: A/B of the dense GEMMs under torch.compile, same machine: custom
# ops (the eager kernels; this code) against the traced references (dispatch._COMPILED set to
# _TRACED on this copy), at T=1024 / 16384, H=1024 / 2048, GELU and SwiGLU (issue 20).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 220 python3 -m benchmarks.sizes --part dense --reps 10 --T 1024 16384 --H 1024 2048 --out $OUT/dense_ops > $OUT/dense_ops.log 2>&1; echo "ops rc=$?"
sed -i 's/^_COMPILED = _TRACED | .*/_COMPILED = _TRACED/' fuseops/kernels/dispatch.py && grep -n "^_COMPILED" fuseops/kernels/dispatch.py
timeout 220 python3 -m benchmarks.sizes --part dense --reps 10 --T 1024 16384 --H 1024 2048 --out $OUT/dense_traced > $OUT/dense_traced.log 2>&1; echo "traced rc=$?"
tail -9 $OUT/dense_ops.log | cut -c1-130
tail -9 $OUT/dense_traced.log | cut -c1-130
