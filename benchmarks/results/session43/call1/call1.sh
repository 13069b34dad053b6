# Prepared in session 42 for the next device session's first call (run it with branch moe-eager-replay merged
# into the working tree; ~9 min): (a) the GPU tests the merge touches: the recorded-program / graph tests (with
# session 42's descriptor test) and the MoE gpu tests; (b) the branch's A/B: an expert_layer step's host time
# with its eager runs through recorded programs (--replay 1) and without (--replay 0), Qwen3 T=16384 (eager: GPU-
# bound) and T=1024 (graphed); (c) the compiled step's extra GPU time at GPU-bound dense cells (compiled_gap.py).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
LIMIT=150 bash benchmarks/run_gpu.sh graphs 2>&1 | tail -3
S=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/moe -x > $OUT/moe_gpu.log 2>&1
echo "moe gpu rc=$? ($((SECONDS - S)) s)"; tail -2 $OUT/moe_gpu.log
for r in 1 0; do
  S=$SECONDS
  timeout 100 python3 benchmarks/results/session42/moe_host_parts.py --cells qwen3:16384 qwen3:1024 --replay $r \
    > $OUT/moe_host_parts_replay$r.log 2>&1
  echo "moe_host_parts replay=$r rc=$? ($((SECONDS - S)) s)"; grep -v Warning $OUT/moe_host_parts_replay$r.log | tail -36
done
S=$SECONDS
timeout 170 python3 benchmarks/results/session42/compiled_gap.py --cells gelu:16384:4096 --rounds 4 > $OUT/compiled_gap.log 2>&1
echo "compiled_gap rc=$? ($((SECONDS - S)) s)"; grep -v Warning $OUT/compiled_gap.log | tail -20 | cut -c1-220
