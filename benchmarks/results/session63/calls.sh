#!/usr/bin/env bash
# Session 63's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
# Prepared for session 64 (one call a line; chain them within 30 s of each other):
#   SIDE_LIMIT=300 bash benchmarks/results/session63/calls.sh refs_gpu    # the activation references on CUDA + torch 2.11
#   LIMIT=300 bash benchmarks/results/session63/calls.sh "gpu:edge:ForwardQuantizedGroupedMLP-non_finite or ForwardQuantizeLinear"
#   LIMIT=540 bash benchmarks/results/session63/calls.sh gpu:models2      # integrations + offload
#   LIMIT=540 bash benchmarks/results/session63/calls.sh gpu:quantops
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session63 exec bash benchmarks/results/session55/calls.sh "$@"
