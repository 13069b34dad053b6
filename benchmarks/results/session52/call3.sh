# Session 52, device call 3: phases.py (host and GPU per phase of a drained step, no profiler; host syncs), then
# the graphs part again (run 2: one failure that passed alone; its log did not come back).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 benchmarks/results/session52/phases.py --cells gelu:1024:4096 gelu:1024:1024 \
  > $OUT/phases.log 2>&1; echo "phases rc=$?"
LIMIT=240 OUT=$OUT bash benchmarks/run_gpu.sh graphs > $OUT/graphs_part.txt 2>&1; cat $OUT/graphs_part.txt
grep -B5 -A30 "^____" $OUT/graphs.log | grep -E "Error|assert|said|states" | head -20 | cut -c1-400
cat $OUT/phases.log | grep -v Warn | cut -c1-250
