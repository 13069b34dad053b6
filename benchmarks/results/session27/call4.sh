# Session 27, device calls 3-4: why the skewed MoE cells enqueue slower than eager (sizes.measure's order).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 benchmarks/results/session27/skew_states.py qwen3 1024 > $OUT/skew_qwen3.log 2>&1
echo "skew qwen3 rc=$? ($((SECONDS - S)) s)"
grep -v "Warn\|warn\|^  *[a-z_]* = \|^    " $OUT/skew_qwen3.log | cut -c1-400 | tail -30
