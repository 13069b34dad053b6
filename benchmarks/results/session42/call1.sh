# Session 42, call 1: an eager replay's host time line by line at GPU-bound dense cells (replay_lines.py). ~3 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 400 python3 benchmarks/results/session42/replay_lines.py --cells gelu:16384:4096 gelu:4096:2048 swiglu:4096:2048 gelu:1024:1024 > $OUT/call1_replay_lines.log 2>&1
echo "rc=$? ($((SECONDS - S)) s)"; grep -v Warning $OUT/call1_replay_lines.log | grep -v "return Variable" | tail -80
