#!/usr/bin/env bash
# Session 66's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
#   call 1: session65/calls.sh norm_gpu (its A/B did not apply the old module: norm_ab here)
export PYTHONPATH=. PYTHONUNBUFFERED=1
[[ -z ${PARTS_DIR:-} ]] && export PARTS_DIR=benchmarks/results/session66
for part in "$@"; do
  if [[ -f benchmarks/results/session66/$part.sh ]]; then PARTS_DIR=benchmarks/results/session66 bash benchmarks/results/session55/calls.sh "$part"
  else PARTS_DIR=benchmarks/results/session65 bash benchmarks/results/session55/calls.sh "$part"; fi
done
