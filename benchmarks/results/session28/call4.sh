# Session 28, device call 4: inside our launch (call 3: 50-90 us of a launcher's 80-170 us is the
# launch): fast or Triton's path per launcher, the stored entry's call and the C launcher's share;
# two more quantized edge cases.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 benchmarks/results/session28/launcher_costs.py qwen3 1024 > $OUT/launcher_costs_qwen3.log 2>&1
echo "launcher_costs qwen3 rc=$? ($((SECONDS - S)) s)"; grep -v "Warn\|warn" $OUT/launcher_costs_qwen3.log | tail -28; S=$SECONDS
LIMIT=230 bash benchmarks/run_gpu.sh edge "BackwardQuantizedGatedMLP and (non_finite or dtype_max)"; cp /tmp/fuseops-gpu/edge.log $OUT/ 2>/dev/null
echo "edge ($((SECONDS - S)) s)"
