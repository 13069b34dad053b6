#!/usr/bin/env bash
# Session 61's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
# Run in session 61: run 2 session 60's `dispatch_gpu`; run 3 `gpu:props:ForwardLinearAddExtraInput or
# ForwardLinearBiasActivation`; run 4 `gpu:kernels`; run 5 `float32`; run 6 `float32_tf32`; run 7 `fp32_tiles`.
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session61 exec bash benchmarks/results/session55/calls.sh "$@"
