#!/usr/bin/env bash
# Session 55: the machine goes back 30 s after a call, so one call runs several parts of sessions 52 and 54's
# next_device_calls.sh in a row. Each part tars its logs into $OUT/<part>.tar.
#   bash benchmarks/results/session55/calls.sh top threads
parts52=" edge_rest quantops "
for part in "$@"; do
  echo "== $part $(date +%T)"
  if [[ $parts52 == *" $part "* ]]; then
    bash benchmarks/results/session52/next_device_calls.sh "$part"
  elif [[ -f benchmarks/results/session55/$part.sh ]]; then
    mkdir -p "$OUT/$part" && OUT_PART=$OUT/$part bash "benchmarks/results/session55/$part.sh"
    tar -cf "$OUT/$part.tar" -C "$OUT" "$part" && rm -rf "${OUT:?}/$part"
  else
    bash benchmarks/results/session54/next_device_calls.sh "$part"
  fi
done
echo "== done $(date +%T)"
