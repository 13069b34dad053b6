# Session 43, call 2: the descriptor test as mended; the MoE gpu tests (but routing_graphs', run in call 1) with
# branch moe-eager-replay merged; the branch's in-process A/B; then models2 as far as the time goes.
# (moe_replay_ab.py is now moe_host_ab.py, run with --ab replay.)
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/ops/executor/test_graphed.py -k descriptor > $OUT/descriptor.log 2>&1
echo "descriptor rc=$? ($((SECONDS - S)) s)"; tail -1 $OUT/descriptor.log
S=$SECONDS
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu tests/moe --ignore=tests/moe/test_routing_graphs.py > $OUT/moe_gpu.log 2>&1
echo "moe gpu rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/moe_gpu.log | cut -c1-200; tail -1 $OUT/moe_gpu.log
S=$SECONDS
timeout 150 python3 benchmarks/results/session43/moe_replay_ab.py --cells qwen3:16384 qwen3:4096 qwen3:1024 olmoe:1024 > $OUT/moe_replay_ab.log 2>&1
echo "replay A/B rc=$? ($((SECONDS - S)) s)"; grep -v Warn $OUT/moe_replay_ab.log | grep -v warn | tail -32
LIMIT=$((560 - SECONDS)) bash benchmarks/run_gpu.sh models2 2>&1 | tail -4
