# Session 60: the dense dispatch's new rows (gated GEMM, dgrad epilogues) on the H100: their GPU tests, the executor's
# GPU tests (recorded programs and CUDA graphs of dense models, which now hold the cuBLAS branches at small shapes),
# and the CUDA property tests of the dgrad fusions the rows serve. Run 12 ran it before the float32 / float16 rules
# and before test_dense_cublas.py's gated and dgrad tests (added to the first line since).
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 180 python3 -m pytest -p no:cacheprovider -q -rfE tests/kernels/test_dense_dispatch.py \
  tests/kernels/gemm/test_dense_cublas.py > "$OUT_PART/dispatch_tests.log" 2>&1
echo "dispatch tests rc=$?"; tail -1 "$OUT_PART/dispatch_tests.log"
LIMIT=${GRAPHS_LIMIT:-230} OUT=$OUT_PART bash benchmarks/run_gpu.sh graphs | tail -3
LIMIT=${PROPS_LIMIT:-150} OUT=$OUT_PART bash benchmarks/run_gpu.sh props "${PROPS:-BackwardActivationLinear or BackwardExtraOutputLinear}" | tail -3
