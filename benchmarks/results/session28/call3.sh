# Session 28, device call 3: each launcher of a compiled MoE step at T=1024 timed alone (full, its
# Python alone), Qwen3 and OLMoE; the FP8 synchronisation hunt with graphs off; the CUDA edge cases of
# two quantized fusions (not run since session 23).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for shape in qwen3 olmoe; do
  timeout 150 python3 benchmarks/results/session28/launcher_costs.py $shape 1024 > $OUT/launcher_costs_$shape.log 2>&1
  echo "launcher_costs $shape rc=$? ($((SECONDS - S)) s)"; grep -v "Warn\|warn" $OUT/launcher_costs_$shape.log | tail -14; S=$SECONDS
done
timeout 150 python3 benchmarks/results/session28/sync_hunt.py 1024 > $OUT/sync_hunt.log 2>&1
echo "sync_hunt rc=$? ($((SECONDS - S)) s)"; grep -v "^\s*$" $OUT/sync_hunt.log | grep -v "^\s\s\s\s\|Warn\|debug_mode" | cut -c1-220 | tail -60; S=$SECONDS
LIMIT=240 bash benchmarks/run_gpu.sh edge "BackwardQuantizedGatedMLP or BackwardGatedAmaxLinear"; cp /tmp/fuseops-gpu/edge.log $OUT/ 2>/dev/null
echo "edge ($((SECONDS - S)) s)"
