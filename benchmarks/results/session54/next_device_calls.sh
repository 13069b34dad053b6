# Prepared in session 54 for the next device session. One call each; a call returns at most eight files, so each
# part writes its logs under $OUT/<part>/ and tars them into one file.
#   bash benchmarks/results/session54/next_device_calls.sh top         # ~3 min: the top-level tests after session
#                                                                      # 54's op changes (GatedActivation.scaled, a
#                                                                      # replaced public attribute drops plans)
#   bash benchmarks/results/session54/next_device_calls.sh moe_sizes   # ~5 min: sizes.py's MoE cells at T=1024 and
#                                                                      # 4096 with session 54's graph decisions
#   bash benchmarks/results/session54/next_device_calls.sh moe_gpu     # ~1.5 min: moe_gpu.py again (another process)
#   bash benchmarks/results/session54/next_device_calls.sh dense_small # ~5 min: sizes.py's dense cells at T=1024
#                                                                      # (eager and compiled) and float32 weights under
#                                                                      # autocast, after session 54's graph decisions
#   bash benchmarks/results/session54/next_device_calls.sh threads     # ~2 min: engine_threads.py (the autograd
#                                                                      # engine's device thread's share of the host)
#   bash benchmarks/results/session52/next_device_calls.sh edge_rest   # the CUDA edge cases left (session 52's)
#   bash benchmarks/results/session52/next_device_calls.sh quantops
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
part=${1:-}
mkdir -p "$OUT/$part"
case "$part" in
  top)
    LIMIT=300 OUT=$OUT/$part bash benchmarks/run_gpu.sh top | tail -3 ;;
  moe_sizes)
    timeout 500 python3 -m benchmarks.sizes --part moe --shapes qwen3 olmoe --T 1024 4096 --rounds 2 \
      --out "$OUT/$part/sizes_moe" > "$OUT/$part/sizes_moe.log" 2>&1; echo "sizes rc=$?"
    tail -9 "$OUT/$part/sizes_moe.log" | cut -c1-250 ;;
  moe_gpu)
    timeout 150 python3 benchmarks/results/session54/moe_gpu.py 2>&1 | grep -v Warn | tee "$OUT/$part/moe_gpu.log" \
      | grep -E "step|refusals" | cut -c1-200 ;;
  dense_small)
    timeout 330 python3 -m benchmarks.sizes --part dense --H 1024 2048 --T 1024 --rounds 2 \
      --out "$OUT/$part/sizes_dense" > "$OUT/$part/sizes_dense.log" 2>&1; echo "sizes rc=$?"
    tail -5 "$OUT/$part/sizes_dense.log" | cut -c1-250
    timeout 200 python3 -m benchmarks.autocast --T 1024 --models qwen3 dense > "$OUT/$part/autocast.log" 2>&1
    echo "autocast rc=$?"; tail -4 "$OUT/$part/autocast.log" | cut -c1-250 ;;
  threads)
    timeout 200 python3 benchmarks/results/session54/engine_threads.py 2>&1 | grep -v Warn \
      | tee "$OUT/$part/engine_threads.log" | cut -c1-250 ;;
  *) echo "usage: $0 top|moe_sizes|moe_gpu|dense_small|threads"; exit 1 ;;
esac
tar -cf "$OUT/$part.tar" -C "$OUT" "$part" && rm -rf "${OUT:?}/$part"
