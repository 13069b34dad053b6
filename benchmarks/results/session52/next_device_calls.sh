# Prepared in session 52 for the next device session. One call each; a call returns at most eight files, so each
# part writes its logs under $OUT/<part>/ and tars them into one file.
#   bash benchmarks/results/session52/next_device_calls.sh edge_rest   # ~4 min: the unquantized Backward edge cases
#                                                                      # run 6 did not reach, then the quantized
#                                                                      # Backward subjects until the limit
#   bash benchmarks/results/session52/next_device_calls.sh quantops    # ~8 min: run_gpu.sh quantops
#   bash benchmarks/results/session52/next_device_calls.sh ab TREE     # ~3 min: per_block_graphs.py on this tree,
#                                                                      # then on TREE (a copy with a host-path trim:
#                                                                      # `mkdir TREE && git archive BRANCH fuseops
#                                                                      # benchmarks pyproject.toml | tar -x -C TREE`,
#                                                                      # TREE ignored by .git/info/exclude and carried)
#                                                                      # one process each, one machine
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
part=${1:-}
mkdir -p "$OUT/$part"
case "$part" in
  edge_rest)
    LIMIT=150 OUT=$OUT/$part bash benchmarks/run_gpu.sh edge \
      "(BackwardActivationLinear and non_contiguous) or BackwardExtraOutputLinear" | tail -3
    mv "$OUT/$part/edge.log" "$OUT/$part/edge_unquantized.log"
    LIMIT=330 OUT=$OUT/$part bash benchmarks/run_gpu.sh edge "BackwardQuantizedGatedMLP or BackwardGatedAmaxLinear" \
      | tail -3 ;;
  quantops)
    LIMIT=540 OUT=$OUT/$part bash benchmarks/run_gpu.sh quantops | tail -3 ;;
  ab)
    tree=${2:?usage: $0 ab TREE}
    timeout 150 python3 benchmarks/results/session52/per_block_graphs.py --cells gelu:1024:2048 gelu:1024:1024 \
      2>&1 | grep -v Warn | tee "$OUT/$part/main.log" | tail -8
    (cd "$tree" && PYTHONPATH=. timeout 150 python3 -P benchmarks/results/session52/per_block_graphs.py \
      --cells gelu:1024:2048 gelu:1024:1024 2>&1 | grep -v Warn | tee "$OUT/$part/tree.log" | tail -8) ;;
  *) echo "usage: $0 edge_rest|quantops|ab TREE"; exit 1 ;;
esac
tar -cf "$OUT/$part.tar" -C "$OUT" "$part" && rm -rf "${OUT:?}/$part"
