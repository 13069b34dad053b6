# Prepared in session 47 for the next device session. One call each:
#   git checkout dead-results && bash benchmarks/results/session47/next_device_calls.sh dead_results
#     ~8 min: the branch's GPU tests (the graphs part: graph_pool's reuse, the cover, the MoE routing states that
#     failed in call 11), then peak memory and host time with every program graphed against today's rule and
#     torch eager (merge where the tests pass; make FUSEOPS_CUDA_GRAPHS=all the default only where memory is within
#     a few % of eager's)
#   bash benchmarks/results/session46/next_device_calls.sh suite       # the CUDA edge cases from
#     GroupedMLP-non_contiguous on (call 10 passed Quantize and GroupedMLP up to it), then quantops
#   bash benchmarks/results/session46/next_device_calls.sh moe mixtral # Mixtral after the keep rule
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-}" in
  dead_results)
    git log --oneline -1 2>/dev/null
    LIMIT=230 bash benchmarks/run_gpu.sh graphs 2>&1 | tail -3
    timeout 300 python3 benchmarks/results/session46/shared_pool.py \
      --cells gelu:4096:4096 swiglu:4096:4096 gelu:16384:4096 moe:qwen3:4096 \
      --variants torch today all_shared > $OUT/shared_pool.log 2>&1; echo "shared_pool rc=$?"
    tail -14 $OUT/shared_pool.log | cut -c1-160 ;;
  *) echo "usage: $0 dead_results" ;;
esac
