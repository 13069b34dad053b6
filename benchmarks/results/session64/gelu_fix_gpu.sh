# Session 64: after the GELU saturation fix (activation_math.py: the kernels' GELU(tanh) derivative, the references'
# GELU / GELU(tanh) at |x| >= 2^40): the activation tests on torch 2.11 (CPU and CUDA), the GEMM kernels whose
# epilogues apply an activation (CUDA, -k gelu), then the dense stack's small cells eager and compiled (the CPU-only
# compile branch of session 63 and this change on the GPU path: neither should move them).
timeout -s INT -k 20 ${SIDE_LIMIT:-150} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/ops/test_activation.py tests/ops/test_gated.py > "$OUT_PART/refs3.log" 2>&1
echo "refs3 rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/refs3.log" | cut -c1-200; tail -1 "$OUT_PART/refs3.log"
timeout -s INT -k 20 ${GEMM_LIMIT:-200} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu -k "gelu or GELU" \
  tests/kernels/gemm/test_dense.py tests/kernels/gemm/test_dense_gated.py tests/kernels/gemm/test_grouped.py \
  tests/kernels/gemm/test_grouped_gated.py tests/kernels/gemm/test_dense_cublas.py > "$OUT_PART/gemm_gelu.log" 2>&1
echo "gemm_gelu rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/gemm_gelu.log" | cut -c1-200; tail -1 "$OUT_PART/gemm_gelu.log"
timeout ${SIZES_LIMIT:-200} python3 -m benchmarks.sizes --part dense --H 1024 2048 --T 1024 --rounds 1 \
  --out "$OUT_PART/sizes_dense" > "$OUT_PART/sizes_dense.log" 2>&1; echo "sizes rc=$?"
tail -8 "$OUT_PART/sizes_dense.log" | cut -c1-250
