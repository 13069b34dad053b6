# Session 43, call 7: the GPU suite's `models` part (tests/fusions but the property suite and the CUDA edge cases)
# after the moe-eager-replay merge and the ragged-descriptor change; then benchmarks.autocast (float32 weights
# under torch.autocast, last run in session 41).
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=400 bash benchmarks/run_gpu.sh models 2>&1 | tail -5
S=$SECONDS
timeout $((590 - SECONDS)) python3 -m benchmarks.autocast --T 1024 > $OUT/autocast.log 2>&1
echo "autocast rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/autocast.log | cut -c1-200
