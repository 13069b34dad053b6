#!/usr/bin/env bash
# Session 63's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session63 exec bash benchmarks/results/session55/calls.sh "$@"
