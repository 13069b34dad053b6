# Session 31, device call 5: why the compiled dense stack runs slower than our eager one at T=1024 (call 4:
# gelu H=4096 6.09 against 5.42 ms, GPU-bound; swiglu H=1024 2.35 against 1.28): per variant the GPU's
# work in one step (kernels, span, idle) and the graph counts; then the GPU tests of tests/ops/executor
# that calls 3-4 did not run.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for cell in gelu:1024:4096 swiglu:1024:1024; do
  timeout 130 python3 benchmarks/results/session31/gpu_split.py dense:$cell eager compiled torch.compile > $OUT/gpu_split_$cell.log 2>&1
  echo "gpu split $cell rc=$? ($((SECONDS - S)) s)"; grep -E "^(==|--) " $OUT/gpu_split_$cell.log | cut -c1-330; S=$SECONDS
done
timeout -s INT -k 10 150 python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/ops/executor \
  --ignore=tests/ops/executor/test_graphed.py > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/gpu_tests.log | cut -c1-250 | head -12; tail -1 $OUT/gpu_tests.log
