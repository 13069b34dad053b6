# Session 26, device call 3: the executor's GPU tests (call 2's summary was cut from the transcript),
# compile's GPU tests, then the dense part of the sizes table, every cell.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/executor --tb=short > $OUT/executor.log 2>&1
echo "executor tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/executor.log | cut -c1-200; tail -1 $OUT/executor.log; S=$SECONDS
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_compile.py --tb=short > $OUT/compile.log 2>&1
echo "compile tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/compile.log | cut -c1-200; tail -1 $OUT/compile.log; S=$SECONDS
timeout 330 python3 -m benchmarks.sizes --part dense --rounds 2 --reps 10 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; tail -21 $OUT/sizes_dense.log | cut -c1-220
