# Session 27, device call 5: a graph captured again after its inputs moved and dropped against the old
# eager samples is measured afresh (graphed.py): the executor's GPU tests, the skewed-cell states, the
# MoE sizes at T=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 120 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=short tests/ops/executor > $OUT/executor.log 2>&1
echo "executor rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/executor.log | cut -c1-250 | head -12; tail -1 $OUT/executor.log; S=$SECONDS
timeout 100 python3 benchmarks/results/session27/skew_states.py qwen3 1024 > $OUT/skew_qwen3.log 2>&1
echo "skew qwen3 rc=$? ($((SECONDS - S)) s)"; S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part moe --T 1024 --rounds 2 --reps 10 --out $OUT/sizes_moe1024 > $OUT/sizes_moe1024.log 2>&1
echo "sizes moe T=1024 rc=$? ($((SECONDS - S)) s)"
grep -v "Warn\|warn\|^  *[a-z_]* = \|^    " $OUT/skew_qwen3.log | cut -c1-300 | tail -14
tail -8 $OUT/sizes_moe1024.log | cut -c1-220
