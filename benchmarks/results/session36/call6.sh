# Session 36, call 6: hopper/tensor_scaled.py (new): a warp-specialized Gluon kernel for the FP8
# per-tensor grouped GEMMs (forward, dgrad), tried against the Triton kernel at the Qwen3 shape.
# Its GPU tests first (correctness against float64 and the Triton kernel), then the timings.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 -m pytest -p no:cacheprovider -q -x --tb=short tests/kernels/hopper/test_tensor_scaled.py 2>&1 | tail -25 | cut -c1-300
echo "tests ($((SECONDS - S)) s)"; S=$SECONDS
timeout 200 python3 -m benchmarks.fp8_gemm_tiles --library-only --out $OUT/gluon_tiles_qwen3.json > $OUT/gluon_tiles_qwen3.log 2>&1
echo "tiles rc=$? ($((SECONDS - S)) s)"; grep -v "Warning\|_warn_once" $OUT/gluon_tiles_qwen3.log | tail -30 | cut -c1-160
