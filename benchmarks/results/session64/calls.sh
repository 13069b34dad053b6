#!/usr/bin/env bash
# Session 64's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
#   (call 1 ran session 63's: SIDE_LIMIT=300 LIMIT=240 bash benchmarks/results/session63/calls.sh refs_gpu "gpu:edge:..."
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session64 exec bash benchmarks/results/session55/calls.sh "$@"
