#!/usr/bin/env bash
# Session 55: the machine goes back 30 s after a call, so one call runs several parts of sessions 52 and 54's
# next_device_calls.sh in a row. Each part tars its logs into $OUT/<part>.tar.
#   bash benchmarks/results/session55/calls.sh top threads
#   LIMIT=300 bash benchmarks/results/session55/calls.sh gpu:ops gpu:quantops   # run_gpu.sh parts, LIMIT s each
# Prepared for session 56 (one call each line; the machine is warm for 30 s after a call):
#   bash benchmarks/results/session55/calls.sh offload             # ~4 min: issue 23's benchmark, last run session 23
#   bash benchmarks/results/session55/calls.sh guards dense_large   # ~7 min: compiled_guards.py; dense H=4096 cells
#   bash benchmarks/results/session55/calls.sh quantize_eager mixtral  # ~5 min: the blockwise column-wise cast's
#                                                                   # eager 0.26 ms against its graph's 0.115; Mixtral
#   LIMIT=540 bash benchmarks/results/session55/calls.sh gpu:models2  # integrations + offload (not run since ~s45)
#   bash benchmarks/results/session55/calls.sh host_by_width       # ~3 min: why the host grows with H at T=1024
parts52=" edge_rest "
# A later session's own parts (PARTS_DIR, session 56's calls.sh) are looked up before session 55's.
for part in "$@"; do
  echo "== $part $(date +%T)"
  dir=benchmarks/results/session55
  [[ -n ${PARTS_DIR:-} && -f $PARTS_DIR/$part.sh ]] && dir=$PARTS_DIR
  if [[ $part == gpu:* ]]; then
    # gpu:<part>[:<selection>] (session 58: `gpu:edge` alone reran the subjects an earlier call had run), e.g.
    #   "gpu:edge:ForwardQuantizeLinear or GroupedMLP"   (quote it: one argument)
    name=${part#gpu:}; selection=()
    [[ $name == *:* ]] && selection=("${name#*:}") && name=${name%%:*}
    mkdir -p "$OUT/$name" && LIMIT=${LIMIT:-540} OUT=$OUT/$name bash benchmarks/run_gpu.sh "$name" "${selection[@]}" | tail -4
    tar -cf "$OUT/$name.tar" -C "$OUT" "$name" && rm -rf "${OUT:?}/$name"
  elif [[ $parts52 == *" $part "* ]]; then
    bash benchmarks/results/session52/next_device_calls.sh "$part"
  elif [[ -f $dir/$part.sh ]]; then
    mkdir -p "$OUT/$part" && OUT_PART=$OUT/$part bash "$dir/$part.sh"
    tar -cf "$OUT/$part.tar" -C "$OUT" "$part" && rm -rf "${OUT:?}/$part"
  else
    bash benchmarks/results/session54/next_device_calls.sh "$part"
  fi
done
echo "== done $(date +%T)"
