#!/usr/bin/env bash
# Session 59's parts (the *.sh files here) beside session 58's and 55's (session 55's calls.sh runs them).
#   bash benchmarks/results/session59/calls.sh batched        # ~6 min: this session's tests on torch 2.11
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session59 exec bash benchmarks/results/session55/calls.sh "$@"
