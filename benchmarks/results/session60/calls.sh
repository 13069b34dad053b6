#!/usr/bin/env bash
# Session 60's parts (the *.sh files here) beside earlier sessions' (session 55's calls.sh runs them).
# Run in session 60: runs 1-4 session 59's calls.sh (batched, hot_path_ab, a gpu:edge slice, gpu:fp8layer +
# gpu:hopper); runs 5 and 8 `python -m benchmarks.dense_dispatch --epilogues bias+swiglu+saved bias+swiglu` (the gated
# GEMM's measured table), runs 6-7 `gated_probe.py`; run 9 `gated_ab`; runs 10-11 `dense_dispatch --epilogues dgrad+gelu
# [dgrad+residual]` (the dgrad epilogues' table); run 12 `dispatch_gpu`; runs 13-14 `dense_dispatch --dtype float32 / float16`.
# Prepared for session 61 (one call a line; chain them within 30 s):
#   GRAPHS_LIMIT=300 PROPS="BackwardExtraOutputLinear or ForwardLinearSeparateBiasActivation" \
#     bash benchmarks/results/session60/calls.sh dispatch_gpu     # ~9 min: the float32 / float16 rules on the GPU
#   LIMIT=540 bash benchmarks/results/session58/calls.sh "gpu:props:ForwardLinearAddExtraInput or ForwardLinearBiasActivation"
#   then session 59's list: gpu:edge slices (ForwardQuantize*), gpu:kernels, gpu:models2, gpu:quantops (540 s)
export PYTHONPATH=. PYTHONUNBUFFERED=1
PARTS_DIR=benchmarks/results/session60 exec bash benchmarks/results/session55/calls.sh "$@"
