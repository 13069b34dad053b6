# Session 29, device call 9: the MoE and executor GPU tests with the compiled Sequential (the
# composition's experts under compile now run as two custom operators), then the dense sizes at
# T=16384 with the compiled column.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 280 python3 -m pytest -q -p no:cacheprovider --tb=short tests/moe tests/ops/executor -m gpu > $OUT/gpu_tests.log 2>&1
echo "moe + executor gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/gpu_tests.log | cut -c1-300 | head -14; tail -1 $OUT/gpu_tests.log; S=$SECONDS
timeout 280 python3 -m benchmarks.sizes --part dense --T 16384 --rounds 1 --reps 5 --out $OUT/sizes_dense > $OUT/sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/sizes_dense.log | cut -c1-220
