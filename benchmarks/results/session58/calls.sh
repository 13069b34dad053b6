#!/usr/bin/env bash
# Session 58's parts (the *.sh files here) beside session 55's and earlier (see session 57's calls.sh).
#   bash benchmarks/results/session58/calls.sh forward_mode        # ~9 min: this session's tests on torch 2.11, `top`
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session58 exec bash benchmarks/results/session55/calls.sh "$@"
