# Session 61: the GEMM kernels follow torch's float32 matmul precision (F32_DOT "ieee" / "tf32"): their GPU tests
# (accuracy of each precision against float64; the CPU tests of the launch arguments and of recorded programs on torch
# 2.11), then benchmarks/float32_precision.py (float32 grouped GEMMs, fuseops against a per-expert torch.mm loop).
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 -c "import torch; print(torch.__version__, torch.backends.cuda.matmul.fp32_precision)"
timeout ${TEST_LIMIT:-170} python3 -m pytest -p no:cacheprovider -q -rfE tests/kernels/gemm/test_float32_precision.py \
  tests/ops/executor/test_replay.py -k "float32" > "$OUT_PART/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT_PART/tests.log" | tail -8
timeout ${BENCH_LIMIT:-200} python3 -m benchmarks.float32_precision --rounds 2 --out "$OUT_PART/float32_precision" \
  > "$OUT_PART/bench.log" 2>&1
echo "bench rc=$?"; grep -v "^{" "$OUT_PART/bench.log" | tail -16
