# Session 43, call 9: where the compiled dense step's extra GPU time goes (compiled_idle.py), beside the synchronised
# step times of the same variants (session42/compiled_gap.py's event timing, 2 rounds).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 300 python3 benchmarks/results/session43/compiled_idle.py --cells gelu:16384:4096 swiglu:4096:4096 > $OUT/compiled_idle.log 2>&1
echo "compiled_idle rc=$? ($((SECONDS - S)) s)"; grep -v -i warn $OUT/compiled_idle.log | tail -24 | cut -c1-200
