#!/usr/bin/env bash
# Session 62's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
# Run in session 62 (README.md here): session 61's fp32_tiles, second_backward + hot_path_ab; gpu:kernels; nn_batched +
# fp32_tiles2; fp32_after; kernels_rest.
# Prepared for session 63 (one call a line; chain them within 30 s of each other):
#   bash benchmarks/results/session62/calls.sh float32_moe        # ~8 min: a float32 MoE model end to end, IEEE then TF32
#   LIMIT=540 bash benchmarks/results/session58/calls.sh gpu:hopper   # not run since session 56
#   LIMIT=540 bash benchmarks/results/session58/calls.sh "gpu:props:ForwardLinearBiasActivation or GroupedMLP"
#   then session 59's list: gpu:edge slices (ForwardQuantize*), gpu:models2, gpu:quantops (540 s)
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session62 exec bash benchmarks/results/session55/calls.sh "$@"
