#!/usr/bin/env bash
# Session 65's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
#   calls 1-3 ran session 64's: compile_gpu, guards_ab (twice: its first copy lacked pyproject.toml)
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session65 exec bash benchmarks/results/session55/calls.sh "$@"
