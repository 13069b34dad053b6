# Prepared in session 53 for the next device session. One call each; a call returns at most eight files, so each
# part writes its logs under $OUT/<part>/ and tars them into one file.
#   bash benchmarks/results/session53/next_device_calls.sh graphs      # ~3 min: the graphs part after session 53's
#                                                                      # settings fix (Sequential.forward's compare)
#   bash benchmarks/results/session53/next_device_calls.sh host_ab     # ~1 min: the trims' paired host A/B again,
#                                                                      # with the settings fix in
#   bash benchmarks/results/session53/next_device_calls.sh moe_t1024   # ~4 min: the MoE composition and layer at
#                                                                      # T=1024 (not measured since session 51)
#   bash benchmarks/results/session52/next_device_calls.sh edge_rest   # the CUDA edge cases left (session 52's)
#   bash benchmarks/results/session52/next_device_calls.sh quantops
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
part=${1:-}
mkdir -p "$OUT/$part"
case "$part" in
  graphs)
    LIMIT=240 OUT=$OUT/$part bash benchmarks/run_gpu.sh graphs | tail -3 ;;
  host_ab)
    timeout 200 python3 benchmarks/results/session53/host_ab.py --compiled 2>&1 | grep -v Warn \
      | tee "$OUT/$part/host_ab.log" ;;
  moe_t1024)
    timeout 400 python3 -m benchmarks.sizes --part moe --shapes qwen3 olmoe --T 1024 --rounds 2 \
      --out "$OUT/$part/sizes_moe_t1024" > "$OUT/$part/sizes_moe_t1024.log" 2>&1; echo "sizes rc=$?"
    tail -7 "$OUT/$part/sizes_moe_t1024.log" | cut -c1-250 ;;
  *) echo "usage: $0 graphs|host_ab|moe_t1024"; exit 1 ;;
esac
tar -cf "$OUT/$part.tar" -C "$OUT" "$part" && rm -rf "${OUT:?}/$part"
