# Prepared in session 46 for the next device session. One call each (run `check` first: session 46's last commits,
# the recording lock in graph_pool.allocations and the private-pool fallback after SHARED_CAPTURES, ran on the CPU only):
#   bash benchmarks/results/session46/next_device_calls.sh check         # ~7 min: graphs part, compile tests (the lock),
#     float32 weights under autocast (the hot path changed after session 46's call 1 measured it)
#   bash benchmarks/results/session46/next_device_calls.sh dense_small   # ~8 min: host-bound cells, shared pool
#   bash benchmarks/results/session46/next_device_calls.sh moe qwen3     # one MoE shape a call (qwen3, olmoe, mixtral)
#   bash benchmarks/results/session46/next_device_calls.sh suite         # edge cases of the grouped / quantized fusions
# dense_small: issue 20's host-bound cells with the graphs in one shared pool (session 46's call 2 ran before it, with
# private pools). moe: the MoE table (last whole in session 43; session 46's call 13 had Qwen3 and OLMoE at T=1024 /
# 4096 only). suite: `edge` GroupedMLP, the quantized and the backward fusions (call 4 reached the norms, residual and
# forward dense fusions, 31 passed; call 16 GroupedLinear, 5 passed), then `quantops`.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-}" in
  check)
    LIMIT=200 bash benchmarks/run_gpu.sh graphs 2>&1 | tail -2
    timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_compile.py tests/test_compiled_sequential.py 2>&1 | tail -2
    timeout 150 python3 -m benchmarks.autocast --T 1024 > $OUT/autocast.log 2>&1; echo "autocast rc=$?"
    tail -5 $OUT/autocast.log | cut -c1-200 ;;
  dense_small)
    timeout 570 python3 -m benchmarks.sizes --part dense --H 1024 2048 --rounds 4 --out $OUT/sizes_dense \
      > $OUT/sizes_dense.log 2>&1; echo "sizes rc=$?"; tail -16 $OUT/sizes_dense.log | cut -c1-200 ;;
  moe)
    timeout 570 python3 -m benchmarks.sizes --part moe --shapes "$2" --rounds 2 --out $OUT/sizes_moe_$2 \
      > $OUT/sizes_moe_$2.log 2>&1; echo "sizes rc=$?"; tail -10 $OUT/sizes_moe_$2.log | cut -c1-250 ;;
  suite)
    LIMIT=400 bash benchmarks/run_gpu.sh edge "GroupedMLP or quantize or Backward" 2>&1 | tail -3
    LIMIT=$((570 - SECONDS)) bash benchmarks/run_gpu.sh quantops 2>&1 | tail -3 ;;
  *) echo "usage: $0 check|dense_small|moe SHAPE|suite" ;;
esac
