# Prepared in session 48 for the next device session (main, with dead results reused). One call each:
#   bash benchmarks/results/session48/next_device_calls.sh all_drops  # ~3 min: why the keep rule drops GPU-bound
#     graphs under FUSEOPS_CUDA_GRAPHS=all (runs 1 / 3: 4-8 drops at T=4096 H=4096, then 1.6-1.9x memory), the
#     samples of each drop; then the dense GPU-bound cells at the default rule (nothing should have changed there)
#   bash benchmarks/results/session46/next_device_calls.sh suite       # the CUDA edge cases' Backward subjects (run 10
#     passed GroupedMLP-non_contiguous and ForwardQuantizedGroupedMLP-non_contiguous, ~150 s each on a fresh machine),
#     then quantops
#   bash benchmarks/results/session46/next_device_calls.sh moe mixtral # Mixtral after the keep rule
#   bash benchmarks/results/session48/next_device_calls.sh moe_host    # ~2 min: where the MoE layer's host time goes
#     with both graphs kept (run 3: 0.71 ms to issue a Qwen3 T=4096 step; the CPU stand-in with no-op replays: 95 us)
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-}" in
  all_drops)
    for cell in gelu:4096:4096 swiglu:4096:4096; do
      echo "== $cell"
      timeout 80 python3 benchmarks/results/session48/dead_results_probe.py host $cell all 2>&1 | tail -20 | cut -c1-300
    done
    timeout 330 python3 -m benchmarks.sizes --part dense --H 4096 --T 4096 16384 --rounds 2 --out $OUT/sizes_dense_4096 \
      > $OUT/sizes_dense_4096.log 2>&1; echo "sizes rc=$?"; tail -6 $OUT/sizes_dense_4096.log | cut -c1-220 ;;
  moe_host)
    timeout 150 python3 benchmarks/results/session48/moe_host_probe.py qwen3 4096 all > $OUT/moe_host_all.log 2>&1
    echo "rc=$?"; head -3 $OUT/moe_host_all.log | cut -c1-250
    timeout 150 python3 benchmarks/results/session48/moe_host_probe.py olmoe 1024 > $OUT/moe_host_olmoe.log 2>&1
    echo "rc=$?"; head -3 $OUT/moe_host_olmoe.log | cut -c1-250 ;;
  *) echo "usage: $0 all_drops|moe_host" ;;
esac
